package prove

import "context"

func (h *Harness) chaos(ctx context.Context, naive bool) Row      { return Row{Error: "todo"} }
