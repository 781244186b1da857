module github.com/onceflow/onceflow/tools

go 1.26

require (
	github.com/onceflow/onceflow/pkg/platform v0.0.0
	github.com/segmentio/kafka-go v0.4.49
)

require (
	github.com/klauspost/compress v1.18.0 // indirect
	github.com/pierrec/lz4/v4 v4.1.16 // indirect
	github.com/xdg-go/pbkdf2 v1.0.0 // indirect
	github.com/xdg-go/scram v1.1.2 // indirect
	github.com/xdg-go/stringprep v1.0.4 // indirect
	golang.org/x/text v0.28.0 // indirect
)

replace github.com/onceflow/onceflow/pkg/platform => ../pkg/platform
