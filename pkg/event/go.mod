module github.com/onceflow/onceflow/pkg/event

go 1.26

require (
	github.com/google/uuid v1.6.0
	github.com/segmentio/kafka-go v0.4.49
)

require (
	github.com/klauspost/compress v1.15.9 // indirect
	github.com/pierrec/lz4/v4 v4.1.15 // indirect
)
