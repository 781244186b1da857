package billing

import (
	"errors"
	"net/http"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/platform/apperr"
)

// Routes registers billing's read API on e: GET /charges/:orderId.
func Routes(e *echo.Echo, b *Billing) {
	e.GET("/charges/:orderId", func(c echo.Context) error {
		id, err := uuid.Parse(c.Param("orderId"))
		if err != nil {
			return apperr.Errorf(apperr.Malformed, "order id %s is not a UUID", apperr.Quote(c.Param("orderId")))
		}
		ch, err := b.Charge(c.Request().Context(), id)
		if errors.Is(err, ErrNotFound) {
			return apperr.Errorf(apperr.NotFound, "order %s has no charge", id)
		}
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, ch)
	})
}
