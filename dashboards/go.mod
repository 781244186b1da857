module github.com/onceflow/onceflow/dashboards

go 1.26

require (
	github.com/grafana/grafana-foundation-sdk/go v0.0.12
	gopkg.in/yaml.v3 v3.0.1
)
