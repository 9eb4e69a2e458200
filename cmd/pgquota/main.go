// Command pgquota grants quota, hands out vouchers, manages leases and
// fencing tokens, and applies pgquota's migrations, from a shell.
//
// Run `pgquota --help` for the commands. Exit status: 0 success or granted,
// 3 denied (limit reached, sold out, lease held, lease lost, stale token), 2
// usage error or bad input, 1 any other error.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	_ "time/tzdata" // time zone names work on machines without a zoneinfo database

	"github.com/pgquota/pgquota/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
