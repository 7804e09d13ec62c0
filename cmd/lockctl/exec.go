package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lockd/lockd/client"
)

// groupPollInterval is how often killGroup looks again for members of the
// command's process group that are not lockctl's children to reap.
const groupPollInterval = 10 * time.Millisecond

// runExec holds key while argv runs. The command gets its own process
// group so that the end of the lease, and the end of the command, stop
// everything it started, not only its first process.
func runExec(ctx context.Context, o *options, key string, argv []string, p proc) int {
	c, ticket, code := takeLock(ctx, o, key, "exec", p)
	if c == nil {
		return code
	}
	defer c.Close()
	heldAtMost := leaseBound(time.Now(), o.lease)
	defer func() { release(c, ticket, "exec", heldAtMost, p) }()

	cmd, exited, code := startCommand(argv, "exec", p, "LOCKD_KEY="+key, "LOCKD_TOKEN="+strconv.FormatUint(ticket.Token(), 10))
	if cmd == nil {
		return code
	}

	// Lost, watched before the first renewal, follows every confirmed one;
	// SIGTERM is re-armed on each.
	lost := ticket.Lost()
	validUntil := ticket.ValidUntil()
	term := time.NewTimer(time.Until(validUntil) - o.grace)
	defer term.Stop()
	var renewed <-chan renewal
	if o.keepalive {
		renewing, stop := context.WithCancel(context.Background())
		confirmed := make(chan renewal, 1)
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			keepAlive(renewing, ticket, o.lease, confirmed, "exec", p)
		}()
		defer func() { stop(); <-stopped }()
		renewed = confirmed
	}
	signalledAtLease := false
	for {
		select {
		case <-exited:
			if !killGroup(cmd.Process.Pid, ticket.Lost()) {
				fmt.Fprintf(p.err, "lockctl exec: processes of the command's group outlived SIGKILL until the lease of %q lapsed\n", key)
			}
			status := exitStatus(cmd.ProcessState)
			if signalledAtLease {
				fmt.Fprintf(p.err, "lockctl exec: the command ended (status %d) after lockctl signalled it at the end of the lease of %q\n", status, key)
				return exitLeaseEnded
			}
			return status
		case r := <-renewed:
			validUntil, heldAtMost = r.validUntil, r.heldAtMost
			if !signalledAtLease {
				term.Reset(time.Until(validUntil) - o.grace)
			}
		case <-term.C:
			signalledAtLease = true
			fmt.Fprintf(p.err, "lockctl exec: the lease of %q may lapse in %v: sending SIGTERM\n", key, max(time.Until(validUntil), 0).Round(time.Millisecond))
			signalGroup(cmd, syscall.SIGTERM)
		case <-lost:
			lost = nil
			signalledAtLease = true
			fmt.Fprintf(p.err, "lockctl exec: the lease of %q may have lapsed: sending SIGKILL\n", key)
			signalGroup(cmd, syscall.SIGKILL)
		case sig := <-p.signals:
			signalGroup(cmd, sig.(syscall.Signal))
		}
	}
}

// startCommand starts argv in its own process group, lockctl its
// subreaper, with the environment less the secret plus env. exited is
// closed when the command's first process has been waited for. On failure
// it reports why and returns a nil cmd and the shell's status.
func startCommand(argv []string, command string, p proc, env ...string) (cmd *exec.Cmd, exited <-chan struct{}, code int) {
	becomeSubreaper()
	cmd = exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(childEnv(os.Environ()), env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = p.in, p.out, p.err
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(p.err, "lockctl %s: %v\n", command, err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return nil, nil, exitNotFound
		}
		return nil, nil, exitCannotRun
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	return cmd, done, exitOK
}

// renewal is what a confirmed renewal tells: until when the lock is
// surely held, and after when it is surely not.
type renewal struct {
	validUntil, heldAtMost time.Time
}

// leaseBound is the instant after which a lease of lease, granted or
// renewed by an answer that arrived at answered, has surely lapsed on the
// server: the server started it before it answered, and a margin covers
// its clock running slower than this one's. Past it, nothing is left to
// release.
func leaseBound(answered time.Time, lease time.Duration) time.Time {
	lease = (lease + time.Second - 1).Truncate(time.Second) // the client rounds up
	return answered.Add(lease + time.Second + lease/100)
}

// keepAlive renews the lease of ticket every third of lease until ctx
// ends, and sends each confirmed renewal on confirmed, replacing one not
// yet taken. The end of ctx also ends a renewal in flight: the command is
// done, and the release must not wait for an answer that may not come;
// that renewal is reported as unanswered. NOT HELD ends the renewals:
// Lost has fired, and exec kills the command. Other failures are
// reported and tried again at the next tick; the validity they leave is
// the last confirmed one.
//
// Not client.Ticket.KeepAlive: exec must learn each confirmed validity to
// move its SIGTERM, and tell the user about each failed renewal.
func keepAlive(ctx context.Context, ticket client.Ticket, lease time.Duration, confirmed chan renewal, command string, p proc) {
	tick := time.NewTicker(lease / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		err := ticket.Renew(ctx, lease)
		answered := time.Now()
		if ctx.Err() != nil {
			if err != nil {
				fmt.Fprintf(p.err, "lockctl %s: renewing the lease of %q: no answer before lockctl stopped renewing\n", command, ticket.Key())
			}
			return
		}
		if errors.Is(err, client.ErrNotHeld) {
			fmt.Fprintf(p.err, "lockctl %s: renewing the lease of %q: the lock is no longer held\n", command, ticket.Key())
			return
		}
		if err != nil {
			fmt.Fprintf(p.err, "lockctl %s: renewing the lease of %q: %v\n", command, ticket.Key(), err)
			continue
		}
		select {
		case <-confirmed:
		default:
		}
		confirmed <- renewal{validUntil: ticket.ValidUntil(), heldAtMost: leaseBound(answered, lease)}
	}
}

func signalGroup(cmd *exec.Cmd, sig syscall.Signal) {
	syscall.Kill(-cmd.Process.Pid, sig)
}

// killGroup kills what the command left running in its process group and
// waits until all of it is gone, so that nothing it started runs once the
// lock is released. As the subreaper, lockctl inherits every process of
// the group whose parent died, and reaps them here; members it cannot
// reap are waited for until they are gone or giveUp is closed, when it
// returns false.
func killGroup(pgid int, giveUp <-chan struct{}) bool {
	for {
		syscall.Kill(-pgid, syscall.SIGKILL)
		_, err := syscall.Wait4(-pgid, nil, 0, nil)
		if err == nil || errors.Is(err, syscall.EINTR) {
			continue
		}
		// ECHILD: no process of the group is lockctl's child any more.
		if errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) {
			return true
		}
		select {
		case <-giveUp:
			return false
		case <-time.After(groupPollInterval):
		}
	}
}

// release releases ticket, unless its lease has surely lapsed by
// heldAtMost (leaseBound): then nothing is held, and a release could only
// wait on a server that may be gone. It reports any other outcome than
// RELEASED, and returns whether the lock is surely no longer held.
func release(c *client.Client, ticket client.Ticket, command string, heldAtMost time.Time, p proc) bool {
	left := time.Until(heldAtMost)
	if left <= 0 {
		fmt.Fprintf(p.err, "lockctl %s: the lease of %q has lapsed: nothing to release\n", command, ticket.Key())
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), left)
	defer cancel()
	switch err := c.Release(ctx, ticket); {
	case err == nil:
	case errors.Is(err, client.ErrNotHeld):
		fmt.Fprintf(p.err, "lockctl %s: %q was no longer held when it was released\n", command, ticket.Key())
	case ctx.Err() != nil || !time.Now().Before(heldAtMost):
		fmt.Fprintf(p.err, "lockctl %s: the lease of %q lapsed before the release was answered: nothing is held\n", command, ticket.Key())
	default:
		fmt.Fprintf(p.err, "lockctl %s: release: %v\n", command, err)
		return false
	}
	return true
}

// exitStatus is the shell's view of how the command ended.
func exitStatus(state *os.ProcessState) int {
	if status, ok := state.Sys().(syscall.WaitStatus); ok && status.Signaled() {
		return exitSignalBase + int(status.Signal())
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
