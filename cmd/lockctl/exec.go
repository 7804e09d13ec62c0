package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lockd/lockd/client"
)

// runExec holds key while argv runs. The command gets its own process
// group so that the end of the lease stops everything it started, not
// only its first process.
func runExec(ctx context.Context, o *options, key string, argv []string, streams stdio) int {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, relayedSignals...)
	defer signal.Stop(signals)

	c, ticket, err := acquireInterruptibly(ctx, o, key, signals)
	if err != nil {
		return reportAcquireError(streams.err, "exec", err)
	}
	defer c.Close()
	defer release(c, ticket, streams)

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(childEnv(os.Environ()), "LOCKD_KEY="+key, "LOCKD_TOKEN="+strconv.FormatUint(ticket.Token(), 10))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = streams.in, streams.out, streams.err
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(streams.err, "lockctl exec:", err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotRun
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()

	term := time.NewTimer(time.Until(ticket.ValidUntil()) - o.grace)
	defer term.Stop()
	lost := ticket.Lost()
	for {
		select {
		case <-exited:
			return exitStatus(cmd.ProcessState)
		case <-term.C:
			fmt.Fprintf(streams.err, "lockctl exec: the lease of %q may lapse in %v: sending SIGTERM\n", key, ticket.Remaining().Round(time.Millisecond))
			signalGroup(cmd, syscall.SIGTERM)
		case <-lost:
			lost = nil
			fmt.Fprintf(streams.err, "lockctl exec: the lease of %q may have lapsed: sending SIGKILL\n", key)
			signalGroup(cmd, syscall.SIGKILL)
		case sig := <-signals:
			signalGroup(cmd, sig.(syscall.Signal))
		}
	}
}

// acquireInterruptibly dials and acquires, giving up when one of the
// relayed signals arrives: before the command runs, a signal is meant for
// lockctl.
func acquireInterruptibly(ctx context.Context, o *options, key string, signals <-chan os.Signal) (*client.Client, client.Ticket, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	acquired := make(chan struct{})
	var watcher sync.WaitGroup
	watcher.Go(func() {
		select {
		case <-signals:
			cancel()
		case <-acquired:
		}
	})
	defer watcher.Wait()
	defer close(acquired)

	c, err := o.dial(ctx)
	if err != nil {
		return nil, client.Ticket{}, err
	}
	ticket, err := c.Acquire(ctx, key, o.acquireOptions())
	if err != nil {
		c.Close()
		return nil, client.Ticket{}, err
	}
	return c, ticket, nil
}

func signalGroup(cmd *exec.Cmd, sig syscall.Signal) {
	syscall.Kill(-cmd.Process.Pid, sig)
}

func release(c *client.Client, ticket client.Ticket, streams stdio) {
	switch err := c.Release(context.Background(), ticket); {
	case errors.Is(err, client.ErrNotHeld):
		fmt.Fprintf(streams.err, "lockctl exec: %q was no longer held when the command ended\n", ticket.Key())
	case err != nil:
		fmt.Fprintln(streams.err, "lockctl exec: release:", err)
	}
}

// exitStatus is the shell's view of how the command ended.
func exitStatus(state *os.ProcessState) int {
	if status, ok := state.Sys().(syscall.WaitStatus); ok && status.Signaled() {
		return 128 + int(status.Signal())
	}
	return state.ExitCode()
}

// childEnv is the environment without the tenant's secret: the command
// gets the fencing token, not the power to take other locks.
func childEnv(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		return strings.HasPrefix(kv, "LOCKD_SECRET=")
	})
}
