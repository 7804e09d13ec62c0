package lockd_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/internal/testcerts"
	"go.yaml.in/yaml/v3"
)

// podIndexField is the label the StatefulSet gives each pod its ordinal
// in, which the manifest reads the node id from.
const podIndexField = "metadata.labels['apps.kubernetes.io/pod-index']"

// raftCertificate reads the dnsNames and secretName of the cert-manager
// Certificate named name in file.
func raftCertificate(t *testing.T, file, name string) (secretName string, dnsNames []string) {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var o struct {
			Kind     string
			Metadata struct{ Name string }
			Spec     struct {
				SecretName string   `yaml:"secretName"`
				DNSNames   []string `yaml:"dnsNames"`
				Usages     []string `yaml:"usages"`
			}
		}
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			t.Fatalf("%s: no Certificate %s", file, name)
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if o.Kind == "Certificate" && o.Metadata.Name == name {
			if !slices.Contains(o.Spec.Usages, "server auth") || !slices.Contains(o.Spec.Usages, "client auth") {
				t.Errorf("%s: Certificate %s usages %q: both ends of a Raft connection present it, want server auth and client auth", file, name, o.Spec.Usages)
			}
			return o.Spec.SecretName, o.Spec.DNSNames
		}
	}
}

// podEnv is a container's environment as the kubelet sets it for the pod
// of ordinal id.
func podEnv(t *testing.T, file string, c k8sContainer, id int) []string {
	t.Helper()
	var env []string
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		case e.ValueFrom.FieldRef.FieldPath == podIndexField:
			env = append(env, fmt.Sprintf("%s=%d", e.Name, id))
		default:
			t.Fatalf("%s: container %s env %s from %q, which this test cannot resolve", file, c.Name, e.Name, e.ValueFrom.FieldRef.FieldPath)
		}
	}
	return env
}

// checkConfigContainer returns the pod's init container check-config,
// which must run lockd's image with the lockd container's arguments and
// volumes and LOCKD_CHECK_CONFIG=true: lockd serve --check-config with
// what the server will start with.
func checkConfigContainer(t *testing.T, file string, pod k8sPodSpec, c k8sContainer) k8sContainer {
	t.Helper()
	i := slices.IndexFunc(pod.InitContainers, func(c k8sContainer) bool { return c.Name == "check-config" })
	if i < 0 {
		t.Fatalf("%s: no init container check-config", file)
	}
	check := pod.InitContainers[i]
	if check.Image != c.Image || !slices.Equal(check.Args, c.Args) || !slices.Equal(check.VolumeMounts, c.VolumeMounts) {
		t.Errorf("%s: check-config must run lockd's image with the lockd container's arguments and volumes", file)
	}
	if !slices.Contains(podEnv(t, file, check, 1), "LOCKD_CHECK_CONFIG=true") {
		t.Errorf("%s: check-config does not set LOCKD_CHECK_CONFIG=true", file)
	}
	return check
}

// TestKubernetesClusterStarts runs lockd as the StatefulSet of
// deploy/kubernetes/cluster.yaml would: for each of the three pods, its
// init container check-config and then its lockd container, each with the
// container's exact arguments and environment. Only what a machine
// running three pods at once has to change is moved: the pods' names on
// the headless Service resolve to loopback ports (lockd-N.lockd-raft:7430
// becomes 127.0.0.1:PORT), each pod's 0.0.0.0 ports become loopback
// ports of its own, and each volume a directory. The Secrets' files are
// made here: the auth file, the admin token, and the Raft certificate
// that deploy/kubernetes/raft-tls.yaml has cert-manager issue (its DNS
// names, plus 127.0.0.1 for the moved addresses) with the CA that signed
// it. The cluster must elect and grant an ACQUIRE of the Go client.
func TestKubernetesClusterStarts(t *testing.T) {
	const file, tlsFile = "deploy/kubernetes/cluster.yaml", "deploy/kubernetes/raft-tls.yaml"
	sts := objectOf(t, readManifest(t, file), "StatefulSet")[0]
	given, c := checkPod(t, file, sts.Spec, serveFlags(t))
	pod := sts.Spec.Template.Spec
	check := checkConfigContainer(t, file, pod, c)

	// The Raft certificate: the Secret the pods mount, naming every peer.
	secretName, dnsNames := raftCertificate(t, tlsFile, "lockd-raft-tls")
	var raftVolume *k8sVolume
	for _, v := range pod.Volumes {
		if v.Secret != nil && v.Secret.SecretName == secretName {
			raftVolume = &v
		}
	}
	if raftVolume == nil {
		t.Fatalf("%s: no volume of the Secret %s that %s issues", file, secretName, tlsFile)
	}
	peerHost := regexp.MustCompile(`(\d+)=([a-z0-9.-]+):(\d+)`)
	peers := peerHost.FindAllStringSubmatch(given["peers"], -1)
	if len(peers) != 3 {
		t.Fatalf("%s: --peers=%s: want three id=host:port", file, given["peers"])
	}
	for _, p := range peers {
		if !slices.Contains(dnsNames, p[2]) {
			t.Errorf("%s: the Raft certificate does not name %s, the --peers host of node %s", tlsFile, p[2], p[1])
		}
	}

	// Files of the Secrets and a data volume per pod.
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "lockd-raft-ca")
	certPEM, keyPEM := ca.IssuePEM(t, "lockd-raft", append(slices.Clone(dnsNames), "127.0.0.1")...)
	tenantSecret := strings.Repeat("ab", 32)
	secret, _ := hex.DecodeString(tenantSecret)
	secretFiles := map[string][]byte{
		"auth": []byte("billing:" + tenantSecret + "\n"), "admin-token": []byte(strings.Repeat("cd", 32) + "\n"),
		"tls.crt": certPEM, "tls.key": keyPEM, "ca.crt": ca.PEM(),
	}
	mountDir := func(mount string, id int) string {
		local := filepath.Join(dir, "shared", filepath.Base(mount))
		if given["data-dir"] == mount {
			local = filepath.Join(dir, fmt.Sprintf("lockd-%d", id), "data")
		}
		if err := os.MkdirAll(local, 0o700); err != nil {
			t.Fatal(err)
		}
		return local
	}
	for _, v := range pod.Volumes {
		if v.Secret == nil {
			continue
		}
		m := slices.IndexFunc(c.VolumeMounts, func(m k8sVolumeMount) bool { return m.Name == v.Name })
		for _, item := range v.Secret.Items {
			content, ok := secretFiles[item.Key]
			if !ok {
				t.Fatalf("%s: secret %s item %s: this test makes no such file", file, v.Secret.SecretName, item.Key)
			}
			if err := os.WriteFile(filepath.Join(mountDir(c.VolumeMounts[m].MountPath, 0), item.Path), content, 0o400); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Each pod's name resolves to a loopback port; each pod's own ports
	// are loopback ports.
	addrs := freePorts(t, 9)
	moved := map[string]string{}
	for n, p := range peers {
		moved[p[2]+":"+p[3]] = addrs[n]
	}
	podArgs := func(id int) []string {
		args := slices.Clone(c.Args)
		for j, arg := range args {
			name, value, _ := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
			switch {
			case name == "peers":
				for from, to := range moved {
					value = strings.ReplaceAll(value, from, to)
				}
			case name == "listen":
				value = addrs[2+id]
			case name == "admin":
				value = addrs[5+id]
			case slices.Contains(pathFlags, name):
				for _, m := range c.VolumeMounts {
					if rest, ok := strings.CutPrefix(value, m.MountPath); ok && (rest == "" || rest[0] == '/') {
						value = mountDir(m.MountPath, id) + rest
					}
				}
			default:
				continue
			}
			args[j] = "--" + name + "=" + value
		}
		return args
	}

	bin := buildLockd(t)
	var listens []string
	for id := 1; id <= 3; id++ {
		cmd := exec.Command(bin, podArgs(id)...)
		cmd.Env = append(os.Environ(), podEnv(t, file, check, id)...)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), fmt.Sprintf("ok (cluster node %d)", id)) {
			t.Fatalf("pod lockd-%d, init container check-config: %v\n%s", id, err, out)
		}
	}
	for id := 1; id <= 3; id++ {
		name := fmt.Sprintf("lockd-%d", id)
		p := startProcEnv(t, dir, name, bin, podEnv(t, file, c, id), podArgs(id)...)
		p.listen = addrs[2+id]
		listens = append(listens, p.listen)
		eventually(t, 20*time.Second, "a greeting from "+name, func() (bool, string) {
			select {
			case <-p.done:
				t.Fatalf("%s exited: %v", name, p.cmd.ProcessState)
			default:
			}
			conn, err := dialLockd(p.listen)
			if err != nil {
				return false, err.Error()
			}
			conn.close()
			return true, ""
		})
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := client.Dial(ctx, client.Config{Addrs: listens, Tenant: "billing", Secret: secret})
	if err != nil {
		t.Fatalf("dial the pods: %v", err)
	}
	defer cl.Close()
	eventually(t, 45*time.Second, "a grant from the cluster started with the manifest's arguments", func() (bool, string) {
		ticket, err := cl.Acquire(ctx, "k8s-ready", client.AcquireOptions{Lease: 10 * time.Second, Wait: 2 * time.Second, MinWorkBudget: client.Budget(0)})
		if err != nil {
			return false, err.Error()
		}
		if err := cl.Release(ctx, ticket); err != nil {
			t.Fatalf("release token %d: %v", ticket.Token(), err)
		}
		return ticket.Token() > 0, fmt.Sprintf("token %d", ticket.Token())
	})

	// The manifest logs at info: an election is routine there, and
	// dragonboat's remarks on it, and on a transport lockd replaces, are
	// no warnings.
	for id := 1; id <= 3; id++ {
		log, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("lockd-%d.log", id)))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(log), "\n") {
			if strings.Contains(line, `"level":"warn"`) && regexp.MustCompile(`votes and \d+ rejections|preVotes and|became (PreVote )?candidate|cast (pre)?[vV]ote|mutual TLS disabled`).MatchString(line) {
				t.Errorf("lockd-%d logs a routine election remark as a warning: %s", id, line)
			}
		}
	}

	// What check-config says of the manifest's arguments with plain TCP
	// Raft, as this manifest once shipped: every pod would crash-loop.
	plain := podArgs(1)
	for j, a := range plain {
		if strings.HasPrefix(a, "--peers=") {
			plain[j] = "--peers=" + given["peers"]
		}
	}
	plain = slices.DeleteFunc(plain, func(a string) bool { return strings.HasPrefix(a, "--raft-tls-") })
	cmd := exec.Command(bin, plain...)
	cmd.Env = append(os.Environ(), podEnv(t, file, check, 1)...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), "refusing plain TCP Raft") {
		t.Errorf("check-config of plain TCP Raft on %s: %v, want exit 1 and the refusal\n%s", given["peers"], err, out)
	}
}
