module github.com/onceflow/onceflow/services/reconciler-shim

go 1.26
