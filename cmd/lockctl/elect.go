package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"syscall"
	"time"

	"github.com/lockd/lockd/client"
)

// runElect campaigns for leadership of name and runs argv while leader.
// Until leadership is won a signal is meant for lockctl: it ends the
// campaign. Once argv runs, signals are relayed to its process group.
func runElect(ctx context.Context, o *options, name string, argv []string, p proc) int {
	c, leader, code := campaign(ctx, o, name, p)
	if c == nil {
		return code
	}
	defer c.Close()
	defer resign(leader, p)

	cmd, exited, code := startCommand(argv, "elect", p, "LOCKD_KEY="+name, "LOCKD_TERM="+strconv.FormatUint(leader.Term(), 10))
	if cmd == nil {
		return code
	}
	lost := leader.Lost()
	var kill <-chan time.Time
	signalledAtLoss := false
	for {
		select {
		case <-exited:
			if !killGroup(cmd.Process.Pid, leader.Lost()) {
				fmt.Fprintf(p.err, "lockctl elect: processes of the command's group outlived SIGKILL until leadership of %q was lost\n", name)
			}
			status := exitStatus(cmd.ProcessState)
			if signalledAtLoss {
				fmt.Fprintf(p.err, "lockctl elect: the command ended (status %d) after lockctl signalled it at the loss of leadership of %q\n", status, name)
				return exitLeaseEnded
			}
			return status
		case <-lost:
			lost = nil
			signalledAtLoss = true
			fmt.Fprintf(p.err, "lockctl elect: leadership of %q (term %d) can no longer be confirmed: sending SIGTERM, SIGKILL in %v (%v)\n", name, leader.Term(), o.grace, leader.Err())
			signalGroup(cmd, syscall.SIGTERM)
			kill = time.After(o.grace)
		case <-kill:
			kill = nil
			fmt.Fprintf(p.err, "lockctl elect: the lease of %q may lapse now: sending SIGKILL\n", name)
			signalGroup(cmd, syscall.SIGKILL)
		case sig := <-p.signals:
			signalGroup(cmd, sig.(syscall.Signal))
		}
	}
}

// campaign dials and campaigns for name until it wins, --wait runs out
// or a signal comes. On failure it reports why and returns a nil client
// and the exit status.
func campaign(ctx context.Context, o *options, name string, p proc) (*client.Client, *client.Leadership, int) {
	ctx, interrupted := untilSignal(ctx, p.signals)
	// --wait 0 is one round, as short as a round can be (a second);
	// otherwise rounds of at most the client's default fill --wait.
	wait := max(o.wait, time.Second)
	campaignCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	c, err := o.dial(ctx)
	var leader *client.Leadership
	if err == nil {
		opts := client.ElectionOptions{Lease: o.lease, Grace: o.grace, Round: min(wait, client.DefaultElectionRound)}
		leader, err = c.Campaign(campaignCtx, name, opts)
	}
	sig := interrupted()
	switch {
	case sig != nil:
		if err == nil {
			resign(leader, p)
		}
		if c != nil {
			c.Close()
		}
		fmt.Fprintf(p.err, "lockctl elect: %s before leadership of %q was won: not elected\n", signalName(sig), name)
		return nil, nil, signalExit(sig)
	case c == nil:
		fmt.Fprintf(p.err, "lockctl elect: %v\n", err)
		return nil, nil, exitFailure
	case err != nil:
		c.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			if o.wait > 0 {
				fmt.Fprintf(p.err, "lockctl: %s has a leader; not elected within %v\n", name, o.wait)
			} else {
				fmt.Fprintf(p.err, "lockctl: %s has a leader; not elected\n", name)
			}
			if o.verbose {
				fmt.Fprintf(p.err, "lockctl elect: %v\n", err)
			}
			return nil, nil, exitNotAcquired
		}
		fmt.Fprintf(p.err, "lockctl elect: %v\n", err)
		return nil, nil, acquireExit(err)
	}
	return c, leader, exitOK
}

func resign(leader *client.Leadership, p proc) {
	switch err := leader.Resign(context.Background()); {
	case errors.Is(err, client.ErrNotHeld):
		fmt.Fprintf(p.err, "lockctl elect: leadership of %q (term %d) was already lost when it resigned\n", leader.Name(), leader.Term())
	case err != nil:
		fmt.Fprintf(p.err, "lockctl elect: resign: %v\n", err)
	}
}
