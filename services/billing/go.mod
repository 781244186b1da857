module github.com/onceflow/onceflow/services/billing

go 1.26
