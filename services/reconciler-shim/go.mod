module github.com/onceflow/onceflow/services/reconciler-shim

go 1.26

require (
	github.com/google/uuid v1.6.0
	github.com/labstack/echo/v4 v4.13.4
	github.com/onceflow/onceflow/pkg/platform v0.0.0
	github.com/prometheus/client_golang v1.23.2
)

replace github.com/onceflow/onceflow/pkg/platform => ../../pkg/platform
