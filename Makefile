# Entry points for working on the platform. `make` alone lists them.
# Targets document themselves with a `## ` comment after their prerequisites.

.DEFAULT_GOAL := help

.PHONY: help up down status logs

help: ## List the targets
	@grep -E '^[a-zA-Z0-9_.-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  %-12s %s\n", $$1, $$2}'

up: ## Start PostgreSQL and Kafka on loopback (idempotent; see devstack/stack.sh)
	devstack/stack.sh up

down: ## Stop PostgreSQL and Kafka (data is kept in .devstack/)
	devstack/stack.sh down

status: ## Show whether PostgreSQL and Kafka are running
	devstack/stack.sh status

logs: ## Show the tail of the PostgreSQL and Kafka logs
	devstack/stack.sh logs
