//go:build tools

// Package tools pins xk6, the k6 extension builder, so `make k6` builds the
// same xk6 every time: the module proxy refuses `go install …@latest` for it.
package tools

import _ "go.k6.io/xk6/cmd/xk6"
