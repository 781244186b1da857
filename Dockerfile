# syntax=docker/dockerfile:1
#
# One image for all four onceflow programs and the reconcile job. docker-compose.yml builds it as
# onceflow:dev and picks the program per service with `command`; by hand:
#
#   docker build -t onceflow:dev .
#   docker run --rm onceflow:dev /usr/local/bin/reconciler -h
#
# The binaries are /usr/local/bin/{orders,billing,shim,reconciler,reconcile}. There is
# no default command on purpose: starting "the" service of a four-program
# image would be a guess.

FROM golang:1.26-bookworm AS build
# pipefail: a failing `go mod graph` below must fail the build, not hand
# `go mod download` an empty list.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src

# Module files first, so `go mod download` is a cached layer that only a
# dependency change rebuilds. Keep this list in step with go.work: a module
# missing here makes the workspace fail to load.
COPY go.work go.work.sum ./
COPY contracts/go.mod contracts/go.sum ./contracts/
COPY dashboards/go.mod dashboards/go.sum ./dashboards/
COPY e2e/go.mod e2e/go.sum ./e2e/
COPY examples/minimal/go.mod examples/minimal/go.sum ./examples/minimal/
COPY loadtest/bench/go.mod loadtest/bench/go.sum ./loadtest/bench/
COPY loadtest/prove/go.mod loadtest/prove/go.sum ./loadtest/prove/
COPY pkg/go.mod pkg/go.sum ./pkg/
COPY platform/go.mod platform/go.sum ./platform/
COPY services/billing/go.mod services/billing/go.sum ./services/billing/
COPY services/orders/go.mod services/orders/go.sum ./services/orders/
COPY services/reconciler-shim/go.mod services/reconciler-shim/go.sum ./services/reconciler-shim/
COPY tools/go.mod tools/go.sum ./tools/
# A bare `go mod download` in a workspace downloads the whole module graph,
# which through golang-migrate's optional drivers is some two hundred modules
# the build never uses. Download only what the workspace modules require
# (module graph edges that start at a workspace module), at the versions the
# workspace selects.
RUN go mod graph \
    | awk '$1 !~ /@/ && $2 !~ /^(go|toolchain)@/ && $2 !~ /^github\.com\/onceflow\// { sub(/@.*/, "", $2); print $2 }' \
    | sort -u | xargs go mod download

COPY . .
# Static binaries (no cgo), so they run on distroless/static with no libc;
# -trimpath and -s -w keep build paths and debug tables out of the image.
# The build cache mount makes a source-only change recompile only what changed.
RUN --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ \
        ./services/orders/cmd/orders \
        ./services/billing/cmd/billing \
        ./services/reconciler-shim/cmd/shim \
        ./services/reconciler-shim/cmd/reconciler \
        ./tools/cmd/reconcile
# The reconciler's ledger directory, owned by the image's user (see below).
RUN mkdir /data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
# An empty /data owned by nonroot (65532). When Docker mounts a new, empty
# named volume on a path the image has, it copies that directory's owner and
# mode into the volume, so the volume the compose file mounts here is
# writable by the non-root user without a root init step.
COPY --from=build --chown=65532:65532 /data /data
USER 65532:65532
