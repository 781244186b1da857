package httpserver

import (
	"encoding/json"
	"errors"
	"io"

	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/pkg/platform/apperr"
)

// DecodeJSON reads exactly one JSON object with only known fields from body
// into v. Unknown fields are refused so that a client's misspelt field fails
// loudly instead of becoming a zero value. Errors are apperr.Malformed, except
// the body limit's own error, which the error handler maps to 413.
func DecodeJSON(body io.Reader, v any) error {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var he *echo.HTTPError
		if errors.As(err, &he) {
			return err
		}
		if errors.Is(err, io.EOF) {
			return apperr.Errorf(apperr.Malformed, "request body is empty; want a JSON object")
		}
		return apperr.Errorf(apperr.Malformed, "request body is not valid JSON for this endpoint: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return apperr.Errorf(apperr.Malformed, "request body has data after the JSON object")
	}
	return nil
}
