package strictjson_test

import (
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/platform/strictjson"
)

// placeRequest is services/orders.PlaceRequest, the body of POST /orders
// (platform cannot import the services, so its fields are copied here).
type placeRequest struct {
	CustomerID  string `json:"customerId"`
	AmountCents int64  `json:"amountCents"`
	Currency    string `json:"currency"`
}

// settleRequest is services/reconciler-shim/thirdparty.SettleRequest, the
// body of the reconciler's POST /settlements, as the shim sends it.
type settleRequest struct {
	PaymentID   string `json:"paymentId"`
	OrderID     string `json:"orderId"`
	Kind        string `json:"kind"`
	AmountCents int64  `json:"amountCents"`
	Currency    string `json:"currency"`
}

// BenchmarkUnmarshal decodes the bodies the hot path decodes (one per order
// at each of orders and the reconciler), with the one-pass decoder and with
// the three-pass one it replaced, in the same run. The bodies differ from one
// another as live ones do (ids, amounts), so that no decoder is measured
// on a cache of the last strings it saw.
func BenchmarkUnmarshal(b *testing.B) {
	const distinct = 1024
	bodies := []struct {
		name string
		body func(i int) string
		v    func() any
	}{
		{"body=place_order", func(i int) string {
			return fmt.Sprintf(`{"customerId":"k6-customer-%d","amountCents":%d,"currency":"%s"}`, i%100, 100+i*97%100000, []string{"EUR", "USD", "GBP", "CHF", "JPY"}[i%5])
		}, func() any { return new(placeRequest) }},
		{"body=settlement", func(i int) string {
			return fmt.Sprintf(`{"paymentId":"%s","orderId":"%s","kind":"%s","amountCents":%d,"currency":"EUR"}`, uuid.New(), uuid.New(), []string{"capture", "refund"}[i%2], 100+i*97%100000)
		}, func() any { return new(settleRequest) }},
	}
	impls := []struct {
		name string
		fn   func([]byte, any) error
	}{
		{"impl=threepass", strictjson.ThreePassUnmarshal},
		{"impl=onepass", strictjson.Unmarshal},
	}
	for _, body := range bodies {
		data := make([][]byte, distinct)
		size := 0
		for i := range data {
			data[i] = []byte(body.body(i))
			size += len(data[i])
		}
		for _, impl := range impls {
			b.Run(body.name+"/"+impl.name, func(b *testing.B) {
				b.SetBytes(int64(size / distinct))
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					if err := impl.fn(data[i%distinct], body.v()); err != nil {
						b.Fatal(err)
					}
					i++
				}
			})
		}
	}
}
