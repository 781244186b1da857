package rig

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
)

// Report is what the scenarios' handleSummary writes as JSON (lib.js, report).
type Report struct {
	Scenario           string  `json:"scenario"`
	LoadSeconds        float64 `json:"loadSeconds"`
	OfferedRate        float64 `json:"offeredRate"`
	OrdersPlaced       float64 `json:"ordersPlaced"`
	OrdersPerSecond    float64 `json:"ordersPerSecond"`
	DroppedIterations  float64 `json:"droppedIterations"`
	HTTPP50Ms          float64 `json:"httpP50Ms"`
	HTTPP95Ms          float64 `json:"httpP95Ms"`
	HTTPP99Ms          float64 `json:"httpP99Ms"`
	LagP50Ms           float64 `json:"lagP50Ms"`
	LagP99Ms           float64 `json:"lagP99Ms"`
	LagMaxMs           float64 `json:"lagMaxMs"`
	Settled            float64 `json:"settled"`
	BacklogPeakOrders  float64 `json:"backlogPeakOrders"`
	BacklogPeakBilling float64 `json:"backlogPeakBilling"`
	// Kafka consumer lag peaks, in messages: billing on the orders topic,
	// the shim on the billing topic.
	ConsumerLagPeakBilling float64  `json:"consumerLagPeakBilling"`
	ConsumerLagPeakShim    float64  `json:"consumerLagPeakShim"`
	Errors                 float64  `json:"errors"`
	Lost                   float64  `json:"lost"`
	Duplicated             float64  `json:"duplicated"`
	ThirdPartyDuplicates   float64  `json:"thirdPartyDuplicates"`
	ThresholdsFailed       []string `json:"thresholdsFailed"`
	// The ramp's steps and knee; empty for the other scenarios.
	Steps       []Step  `json:"steps,omitempty"`
	Knee        float64 `json:"knee,omitempty"`
	LagBudgetMs float64 `json:"lagBudgetMs,omitempty"`
	// Spike only: lag by the phase the order was placed in (before, spike, after).
	Phases map[string]*PhaseLag `json:"phases,omitempty"`
	// Smoke only.
	DuplicatesAbsorbed float64 `json:"duplicatesAbsorbed,omitempty"`
	PoisonDeadLettered float64 `json:"poisonDeadLettered,omitempty"`
	// ExitCode is k6's: 0, or 99 when a threshold failed.
	ExitCode int `json:"exitCode"`
	// CPUSeconds is the CPU time each program and k6 used during the run
	// (filled in by K6, not by the script).
	CPUSeconds map[string]float64 `json:"cpuSeconds,omitempty"`
}

// PhaseLag is the lag of the orders placed in one phase of the spike.
type PhaseLag struct {
	LagP50Ms float64 `json:"lagP50Ms"`
	LagP99Ms float64 `json:"lagP99Ms"`
	LagMaxMs float64 `json:"lagMaxMs"`
}

// Step is one plateau of the ramp.
type Step struct {
	Rate     float64 `json:"rate"`
	Achieved float64 `json:"achieved"`
	LagP50Ms float64 `json:"lagP50Ms"`
	LagP99Ms float64 `json:"lagP99Ms"`
	OK       bool    `json:"ok"`
}

// K6 runs a scenario with the project's k6 against p. vars are extra -e
// settings (RATE=…, DURATION=…). k6's own output goes to out. A run whose
// thresholds failed returns its report with ExitCode 99 and no error; an
// error means there is no report.
func K6(ctx context.Context, k6, script string, p *Platform, out io.Writer, vars ...string) (Report, error) {
	dir, err := os.MkdirTemp("", "onceflow-k6-")
	if err != nil {
		return Report{}, err
	}
	defer os.RemoveAll(dir)
	summary := filepath.Join(dir, "summary.json")
	args := []string{"run", "--quiet", "--no-color", "-e", "SUMMARY_JSON=" + summary}
	for _, v := range append(p.K6Env(), vars...) {
		args = append(args, "-e", v)
	}
	cmd := exec.CommandContext(ctx, k6, append(args, script)...)
	cmd.Stdout, cmd.Stderr = out, out
	// k6 keeps its state (login tokens, usage reports) in the home
	// directory; a throw-away one keeps the machine's untouched.
	cmd.Env = append(os.Environ(), "K6_NO_USAGE_REPORT=true", "XDG_CONFIG_HOME="+dir)
	before := p.CPUTimes()
	runErr := cmd.Run()
	cpu := map[string]float64{}
	for name, t := range p.CPUTimes() {
		cpu[name] = (t - before[name]).Seconds()
	}
	if cmd.ProcessState != nil {
		cpu["k6"] = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	}
	var r Report
	b, err := os.ReadFile(summary)
	if err != nil {
		return r, fmt.Errorf("k6 %s wrote no summary (%v): %w", filepath.Base(script), runErr, err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("reading k6's summary: %w", err)
	}
	r.CPUSeconds = cpu
	var exit *exec.ExitError
	switch {
	case runErr == nil:
	case errors.As(runErr, &exit):
		r.ExitCode = exit.ExitCode()
	default:
		return r, runErr
	}
	return r, nil
}

// Warm sends one order through the whole pipeline and waits until the shim
// has forwarded its payment, so the consumers' one-time group join stays
// out of the lags a run measures.
func (p *Platform) Warm(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := post(ctx, p.OrdersURL+"/orders", `{"customerId":"warm-up","amountCents":100,"currency":"EUR"}`); err != nil {
		return fmt.Errorf("warming up: %w", err)
	}
	conn, err := pgx.Connect(ctx, p.ShimDB)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM forwards`).Scan(&n); err != nil {
			return fmt.Errorf("warming up: %w", err)
		}
		if n > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("warming up: the first order did not settle: %w\n%s", ctx.Err(), p.LogTails(20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}
