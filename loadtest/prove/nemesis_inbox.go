package prove

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The inbox's lifecycle faults (issue 29, deliver 6), opt-in: they run only
// when NEMESIS= names them, so the default schedule of every seed stays
// what it was. Both take the third party's busy key ("thirdparty/"), since
// they set its faults: they never overlap a thirdparty step.
const (
	// NemBookReject: the third party books the next N settlements and then
	// answers 422 — a booking that errors on the caller's last attempt (no
	// retry gets past a 4xx). The shim dead-letters each as may_have_called;
	// the end-of-run requeue-all must check before it settles again, so
	// each is booked once.
	NemBookReject = "bookreject"
	// NemHeld: an operator releases or skips held aggregates while calls
	// are in flight. The third party rejects the next N settlements (dead
	// letters: their aggregates are held, their later events park) and
	// answers the rest slowly; halfway through, the nemesis releases every
	// held aggregate of the shim through its endpoint (POST
	// /admin/inbox/parked/release, with a reason): the parked events go on
	// while calls are in flight, and the dead event stays dead and
	// requeueable (the end-of-run requeue-all books it, after its
	// successors: the checker's order rule sees a refund booked before
	// its capture, if the release let one through).
	NemHeld = "held"

	// ActionReleaseHeld is the held kind's operator action.
	ActionReleaseHeld = "release"
	// NemSecondGroup: a second consumer group with the shim's inbox name
	// (CONSUMER_GROUP new, INBOX_NAME kept), started mid-run as the replay
	// runbook starts one: it re-reads the billing topic from the start
	// while the shim's own group goes on, for Hold, then stops (SIGTERM).
	// Everything it reads was forwarded already or is being forwarded by
	// the other group: each must be a duplicate or wait for the other's
	// lease, never a second booking, and its dead-letter writes never
	// overwrite what the other group settled.
	NemSecondGroup = "group2"
)

// planInbox fills in a step of an inbox kind.
func planInbox(s *step, dur func(lo, hi time.Duration) time.Duration, pick func([]string) string) {
	if s.Kind == NemSecondGroup {
		s.Target, s.Hold = "shim-group2", dur(10*time.Second, 25*time.Second)
		return
	}
	s.Target = "thirdparty/"
	s.N, _ = strconv.Atoi(pick([]string{"1", "2", "3", "4", "5"}))
	s.Hold = dur(4*time.Second, 12*time.Second)
	if s.Kind == NemHeld {
		// Release only: a skip gives the event up for good, so its order
		// ends unresolved by design (the checker reports it visibly stuck,
		// as it must: SEED=2902 with skips, docs/proofs.md).
		s.Param = ActionReleaseHeld
	}
}

// runInbox performs a step of an inbox kind.
func (n *nemesisRun) runInbox(ctx context.Context, s step) (string, error) {
	if s.Kind == NemSecondGroup {
		return n.secondGroup(ctx, s)
	}
	faults := n.p.Recon.AdminURL() + "/admin/faults"
	if s.Kind == NemBookReject {
		body := fmt.Sprintf(`{"bookRejectNext":%d}`, s.N)
		if err := postJSON(ctx, faults, []byte(body), nil); err != nil {
			return "", err
		}
		hold(ctx, s.Hold)
		err := postJSON(context.WithoutCancel(ctx), faults, []byte(`{}`), nil)
		return fmt.Sprintf("%s for %.1fs", body, s.Hold.Seconds()), err
	}
	body := fmt.Sprintf(`{"rejectNext":%d,"slowNext":10000,"slowFor":"300ms"}`, s.N)
	if err := postJSON(ctx, faults, []byte(body), nil); err != nil {
		return "", err
	}
	hold(ctx, s.Hold/2)
	acted, actErr := n.actOnHeld(ctx, s.Param)
	hold(ctx, s.Hold-s.Hold/2)
	err := postJSON(context.WithoutCancel(ctx), faults, []byte(`{}`), nil)
	return fmt.Sprintf("%s for %.1fs; %s halfway: %s", body, s.Hold.Seconds(), s.Param, acted), errors.Join(actErr, err)
}

// actOnHeld releases or skips (action) every aggregate the shim's inbox
// holds now, through the shim's operator endpoint, and says what it did.
func (n *nemesisRun) actOnHeld(ctx context.Context, action string) (string, error) {
	rows, err := n.p.shimPool.Query(ctx, `
SELECT DISTINCT consumer, aggregate_type, aggregate_id FROM inbox_dead_keys WHERE status = 'dead' ORDER BY 1, 2, 3 LIMIT 20`)
	if err != nil {
		return "", fmt.Errorf("listing held aggregates: %w", err)
	}
	type held struct{ consumer, typ, id string }
	var hs []held
	for rows.Next() {
		var h held
		if err := rows.Scan(&h.consumer, &h.typ, &h.id); err != nil {
			rows.Close()
			return "", err
		}
		hs = append(hs, h)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return "", err
	}
	var done []string
	var errs []error
	for _, h := range hs {
		body := fmt.Sprintf(`{"consumer":%q,"aggregateType":%q,"aggregateId":%q,"reason":"nemesis: %s while calls are in flight","operator":"nemesis"}`,
			h.consumer, h.typ, h.id, action)
		var out struct {
			Dead   []string `json:"dead"`
			Parked int      `json:"parked"`
		}
		err := postJSON(ctx, n.p.Shim.AdminURL()+"/admin/inbox/parked/"+action, []byte(body), &out)
		var se *statusError
		switch {
		case errors.As(err, &se) && se.code == 404: // applied or acted on meanwhile
			done = append(done, h.id+" (no longer held)")
		case err != nil:
			errs = append(errs, err)
		default:
			done = append(done, fmt.Sprintf("%s (%d dead, %d parked)", h.id, len(out.Dead), out.Parked))
		}
	}
	if len(hs) == 0 {
		return "nothing held", errors.Join(errs...)
	}
	return fmt.Sprintf("%d held: %s", len(hs), strings.Join(done, ", ")), errors.Join(errs...)
}

// secondGroup starts a shim in a fresh consumer group that keeps the
// shim's inbox name, for s.Hold, then stops it.
func (n *nemesisRun) secondGroup(ctx context.Context, s step) (string, error) {
	n.procMu.Lock()
	pr, err := n.p.newInstance[KindShim]()
	n.procMu.Unlock()
	if err != nil {
		return "no instance to start", err
	}
	group := fmt.Sprintf("%s_replay_%d", n.p.ShimGroup, int(s.At.Seconds()))
	pr.hp.SetEnv(map[string]string{"CONSUMER_GROUP": group, "INBOX_NAME": n.p.ShimGroup})
	if err := startPatiently(ctx, pr, true); err != nil {
		return pr.Name + " could not start", err
	}
	hold(ctx, s.Hold)
	lag, lagErr := groupLag(context.WithoutCancel(ctx), n.h.stack.Brokers(), group, n.p.BillingTop)
	pr.Stop()
	read := fmt.Sprintf("lag %d", lag)
	if lagErr != nil {
		read = fmt.Sprintf("lag unknown (%v)", lagErr)
	}
	return fmt.Sprintf("%s in group %s (inbox %s) re-read the billing topic for %.1fs (%s), then left (SIGTERM)",
		pr.Name, group, n.p.ShimGroup, s.Hold.Seconds(), read), nil
}
