package outbox

import (
	"errors"

	"github.com/onceflow/onceflow/pkg/pgerr"
)

// The errors this package's functions wrap, so that callers decide with
// errors.Is and never look at driver errors: the store boundary of the
// outbox is this file, where Postgres's errors become these.
var (
	// ErrUnavailable is wrapped by the error of a prune (a Pruner's run,
	// outboxadmin.Prune), and of an operator function (package
	// outboxadmin), that could not reach Postgres
	// (pgerr.IsUnavailable): worth retrying, and nobody's fault in the
	// request.
	ErrUnavailable = errors.New("outbox: database unavailable")
)

// storeErrors are the names storeErr gives the driver's errors.
var storeErrors = pgerr.StoreErrors{Unavailable: ErrUnavailable}

// storeErr wraps err, an error from Postgres while doing what, translating
// what the driver says into this package's named errors; the driver's error
// stays in the chain for logs.
func storeErr(what string, err error) error { return storeErrors.Translate("outbox: "+what, err) }
