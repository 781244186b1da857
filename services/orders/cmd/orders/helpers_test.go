package main

import (
	"net/http"
	"testing"

	"github.com/onceflow/onceflow/platform/testinfra"
)

// placeOrder places one order through the public listener at addr and fails
// the test unless it is taken (201).
func placeOrder(t *testing.T, addr string) {
	t.Helper()
	testinfra.PostJSON(t, "http://"+addr+"/orders",
		`{"customerId":"c1","amountCents":100,"currency":"EUR"}`, http.StatusCreated)
}
