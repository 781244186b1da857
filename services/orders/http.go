package orders

import (
	"net/http"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/pkg/platform/apperr"
	"github.com/onceflow/onceflow/pkg/platform/httpserver"
	"github.com/onceflow/onceflow/pkg/platform/tracing/tracectx"
)

// Routes registers the orders API on e.
//
//	POST /orders              place an order (honours Idempotency-Key)
//	GET  /orders/:id          read an order
//	POST /orders/:id/cancel   cancel an order
func Routes(e *echo.Echo, s *Service) {
	h := handlers{s}
	e.POST("/orders", h.place)
	e.GET("/orders/:id", h.get)
	e.POST("/orders/:id/cancel", h.cancel)
}

type handlers struct{ s *Service }

// MaxIdempotencyKeyLength bounds the Idempotency-Key header.
const MaxIdempotencyKeyLength = 200

func (h handlers) place(c echo.Context) error {
	var req PlaceRequest
	if err := httpserver.DecodeJSON(c.Request().Body, &req); err != nil {
		return err
	}
	key := c.Request().Header.Get("Idempotency-Key")
	if len(key) > MaxIdempotencyKeyLength {
		return apperr.Errorf(apperr.Invalid, "Idempotency-Key must be at most %d bytes", MaxIdempotencyKeyLength)
	}
	o, replayed, err := h.s.Place(c.Request().Context(), req, key, meta(c, key))
	if err != nil {
		return err
	}
	if replayed {
		c.Response().Header().Set("Idempotent-Replayed", "true")
		return c.JSON(http.StatusOK, o)
	}
	c.Response().Header().Set(echo.HeaderLocation, "/orders/"+o.ID.String())
	return c.JSON(http.StatusCreated, o)
}

func (h handlers) get(c echo.Context) error {
	id, err := orderID(c)
	if err != nil {
		return err
	}
	o, err := h.s.Get(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, o)
}

func (h handlers) cancel(c echo.Context) error {
	id, err := orderID(c)
	if err != nil {
		return err
	}
	o, err := h.s.Cancel(c.Request().Context(), id, meta(c, ""))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, o)
}

func orderID(c echo.Context) (uuid.UUID, error) {
	id, err := uuid.Parse(c.Param("id"))
	if err != nil {
		return uuid.Nil, apperr.Errorf(apperr.Malformed, "order id %q is not a UUID", c.Param("id"))
	}
	return id, nil
}

// meta takes the event metadata from the request: X-Request-Id (generated
// when absent) correlates, the idempotency key (else the request id) is the
// cause, and the request's server span (which continues the caller's
// traceparent header, if any) is the trace the event continues.
func meta(c echo.Context, idempotencyKey string) Meta {
	r := c.Request()
	reqID := r.Header.Get(echo.HeaderXRequestID)
	if reqID == "" || len(reqID) > 200 {
		reqID = uuid.NewString()
	}
	c.Response().Header().Set(echo.HeaderXRequestID, reqID)
	cause := idempotencyKey
	if cause == "" {
		cause = reqID
	}
	return Meta{CorrelationID: reqID, CausationID: cause, Traceparent: tracectx.Traceparent(r.Context())}
}
