package orders

import (
	"io"
	"net/http"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/platform/apperr"
	"github.com/onceflow/onceflow/platform/httpserver"
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

// DecodePlaceRequest reads the body of POST /orders strictly (see
// httpserver.DecodeJSON: exact field names, no unknown fields, no trailing
// data, no invalid UTF-8 or NUL) and validates it. Errors are apperr errors:
// Malformed for what is not a request, Invalid for a request that breaks a rule.
func DecodePlaceRequest(body io.Reader) (PlaceRequest, error) {
	var req PlaceRequest
	if err := httpserver.DecodeJSON(body, &req); err != nil {
		return PlaceRequest{}, err
	}
	if err := req.Validate(); err != nil {
		return PlaceRequest{}, err
	}
	return req, nil
}

func (h handlers) place(c echo.Context) error {
	if err := httpserver.RequireJSON(c.Request()); err != nil {
		return err
	}
	req, err := DecodePlaceRequest(c.Request().Body)
	if err != nil {
		return err
	}
	key := c.Request().Header.Get("Idempotency-Key")
	if len(key) > MaxIdempotencyKeyLength {
		return apperr.Errorf(apperr.Invalid, "Idempotency-Key must be at most %d bytes", MaxIdempotencyKeyLength)
	}
	if err := apperr.CheckText("the Idempotency-Key header", key); err != nil {
		return err
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
		return uuid.Nil, apperr.Errorf(apperr.Malformed, "order id %s is not a UUID", apperr.Quote(c.Param("id")))
	}
	return id, nil
}

// meta takes the event metadata from the request: X-Request-Id (generated
// when absent or unsafe to store; see httpserver.RequestID) correlates, the
// idempotency key (else the request id) is the cause, and the request's
// server span (which continues the caller's traceparent header, if any) is
// the trace the event continues.
func meta(c echo.Context, idempotencyKey string) Meta {
	r := c.Request()
	reqID := r.Header.Get(echo.HeaderXRequestID)
	if !apperr.ValidRequestID(reqID) { // a Service used without httpserver's middleware
		reqID = uuid.NewString()
	}
	c.Response().Header().Set(echo.HeaderXRequestID, reqID)
	cause := idempotencyKey
	if cause == "" {
		cause = reqID
	}
	return Meta{CorrelationID: reqID, CausationID: cause, Traceparent: event.TraceparentFromContext(r.Context())}
}
