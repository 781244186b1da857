module github.com/onceflow/onceflow/services/orders

go 1.26
