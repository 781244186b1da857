module github.com/onceflow/onceflow/pkg/inbox

go 1.26
