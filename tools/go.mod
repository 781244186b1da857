module github.com/onceflow/onceflow/tools

go 1.26

require github.com/segmentio/kafka-go v0.4.49

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.7.5 // indirect
	github.com/klauspost/compress v1.18.0 // indirect
	github.com/pierrec/lz4/v4 v4.1.16 // indirect
	golang.org/x/crypto v0.41.0 // indirect
	golang.org/x/text v0.28.0 // indirect
)

require github.com/onceflow/onceflow/pkg/platform v0.0.0

replace github.com/onceflow/onceflow/pkg/platform => ../pkg/platform
