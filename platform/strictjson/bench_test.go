package strictjson_test

import (
	"testing"

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
// the three-pass one it replaced, in the same run.
func BenchmarkUnmarshal(b *testing.B) {
	bodies := []struct {
		name string
		body string
		v    func() any
	}{
		{"body=place_order", `{"customerId":"k6-customer-42","amountCents":57311,"currency":"EUR"}`,
			func() any { return new(placeRequest) }},
		{"body=settlement", `{"paymentId":"0b5a3f3e-7c1d-4f57-9a3e-2d6c1f8e9a10","orderId":"9d1c2b7a-5e4f-4a3b-8c2d-1e0f9a8b7c6d","kind":"capture","amountCents":57311,"currency":"EUR"}`,
			func() any { return new(settleRequest) }},
	}
	impls := []struct {
		name string
		fn   func([]byte, any) error
	}{
		{"impl=threepass", strictjson.ThreePassUnmarshal},
		{"impl=onepass", strictjson.Unmarshal},
	}
	for _, body := range bodies {
		for _, impl := range impls {
			b.Run(body.name+"/"+impl.name, func(b *testing.B) {
				data := []byte(body.body)
				b.SetBytes(int64(len(data)))
				b.ReportAllocs()
				for b.Loop() {
					if err := impl.fn(data, body.v()); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
