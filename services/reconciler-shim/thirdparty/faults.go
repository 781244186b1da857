package thirdparty

import (
	"sync"
	"time"

	"github.com/onceflow/onceflow/platform/apperr"
)

// Faults is the fault-injection setting: the body of POST /admin/faults, and
// what GET /admin/faults reports is still left of it.
type Faults struct {
	// FailNext is how many of the next settlements are answered 500 without
	// being booked: a third party that is down.
	FailNext int `json:"failNext"`
	// RejectNext is how many of the next settlements are answered 422
	// without being booked: a third party that refuses payments it should
	// take (a setting on its side, put right later). No retry gets past a
	// 4xx, so the caller dead-letters the payment, and an operator requeues
	// it once the third party takes it again.
	RejectNext int `json:"rejectNext"`
	// HangNext is how many of the next settlements are booked and then
	// answered only after HangFor: a third party that processed the request
	// but whose answer arrives too late, which is exactly the case a caller
	// that retries on timeout turns into a duplicate.
	HangNext int `json:"hangNext"`
	// HangFor is how long a hung settlement holds its answer, in Go duration
	// notation ("5s"). Required when HangNext > 0.
	HangFor string `json:"hangFor"`
	// BookRejectNext is how many of the next settlements are booked and
	// then answered 422: a third party that books and then errors, on the
	// caller's last attempt (no retry gets past a 4xx). The caller
	// dead-letters a payment that was booked; its requeue must ask (GET
	// /settlements/{key}) before it settles again.
	BookRejectNext int `json:"bookRejectNext"`
	// SlowNext is how many of the next settlements wait SlowFor before
	// they are booked and answered: a third party that is slow but sound.
	// A caller that gives up during the wait leaves nothing booked, so a
	// slow third party alone never justifies a second booking; it only
	// stretches every call towards the caller's timeout and its lease.
	SlowNext int `json:"slowNext"`
	// SlowFor is how long a slow settlement waits ("600ms"). Required when
	// SlowNext > 0.
	SlowFor string `json:"slowFor"`
}

// The bounds of a fault setting: a stand-in told to fail a billion calls, or
// to hang for a day, is an operator's typo, and would outlast any test.
const (
	// MaxFaultCount is the most FailNext or HangNext one setting takes.
	MaxFaultCount = 10_000
	// MaxHangFor is the longest HangFor. It is longer than any caller's
	// timeout worth testing, and shorter than the server's WriteTimeout
	// default would make pointless.
	MaxHangFor = 2 * time.Minute
)

type fault int

const (
	noFault fault = iota
	failFault
	rejectFault
	hangFault
	bookRejectFault
	slowFault
)

// faultState is the live setting, counted down by each settlement it hits.
type faultState struct {
	mu         sync.Mutex
	failNext   int
	rejectNext int
	hangNext   int
	hangFor    time.Duration
	bookReject int
	slowNext   int
	slowFor    time.Duration
}

// set replaces the whole setting, so a test states what it wants rather than
// depending on what an earlier test left behind.
func (f *faultState) set(in Faults) error {
	for _, n := range []int{in.FailNext, in.RejectNext, in.HangNext, in.SlowNext, in.BookRejectNext} {
		if n < 0 || n > MaxFaultCount {
			return apperr.Errorf(apperr.Invalid, "failNext, rejectNext, hangNext, slowNext and bookRejectNext must be from 0 to %d", MaxFaultCount)
		}
	}
	var hangFor time.Duration
	if in.HangFor != "" {
		d, err := time.ParseDuration(in.HangFor)
		if err != nil || d < 0 || d > MaxHangFor {
			return apperr.Errorf(apperr.Invalid, "hangFor %s is not a duration from 0 to %s, such as \"5s\"", apperr.Quote(in.HangFor), MaxHangFor)
		}
		hangFor = d
	}
	if in.HangNext > 0 && hangFor == 0 {
		return apperr.Errorf(apperr.Invalid, "hangFor is required when hangNext > 0")
	}
	var slowFor time.Duration
	if in.SlowFor != "" {
		d, err := time.ParseDuration(in.SlowFor)
		if err != nil || d < 0 || d > MaxHangFor {
			return apperr.Errorf(apperr.Invalid, "slowFor %s is not a duration from 0 to %s, such as \"600ms\"", apperr.Quote(in.SlowFor), MaxHangFor)
		}
		slowFor = d
	}
	if in.SlowNext > 0 && slowFor == 0 {
		return apperr.Errorf(apperr.Invalid, "slowFor is required when slowNext > 0")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failNext, f.rejectNext, f.hangNext, f.hangFor = in.FailNext, in.RejectNext, in.HangNext, hangFor
	f.slowNext, f.slowFor, f.bookReject = in.SlowNext, slowFor, in.BookRejectNext
	return nil
}

func (f *faultState) get() Faults {
	f.mu.Lock()
	defer f.mu.Unlock()
	return Faults{FailNext: f.failNext, RejectNext: f.rejectNext, HangNext: f.hangNext, HangFor: f.hangFor.String(),
		SlowNext: f.slowNext, SlowFor: f.slowFor.String(), BookRejectNext: f.bookReject}
}

// take consumes one fault for the settlement at hand; failures go first,
// because a third party that is down cannot also be slow, then rejections,
// which answer at once too.
func (f *faultState) take() (fault, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.failNext > 0:
		f.failNext--
		return failFault, 0
	case f.rejectNext > 0:
		f.rejectNext--
		return rejectFault, 0
	case f.hangNext > 0:
		f.hangNext--
		return hangFault, f.hangFor
	case f.bookReject > 0:
		f.bookReject--
		return bookRejectFault, 0
	case f.slowNext > 0:
		f.slowNext--
		return slowFault, f.slowFor
	}
	return noFault, 0
}
