package lockd_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// k8sObject is one object of a manifest, as Kubernetes reads it.
type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec k8sSpec `yaml:"spec"`
}

type k8sSpec struct {
	// Services
	ClusterIP                string                `yaml:"clusterIP"`
	PublishNotReadyAddresses bool                  `yaml:"publishNotReadyAddresses"`
	Selector                 yaml.Node             `yaml:"selector"`
	Ports                    []k8sServicePort      `yaml:"ports"`
	MaxUnavailable           *int                  `yaml:"maxUnavailable"` // PodDisruptionBudget
	Replicas                 *int                  `yaml:"replicas"`
	ServiceName              string                `yaml:"serviceName"`
	Ordinals                 struct{ Start int }   `yaml:"ordinals"`
	Strategy                 struct{ Type string } `yaml:"strategy"`
	Template                 struct {
		Metadata struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec k8sPodSpec `yaml:"spec"`
	} `yaml:"template"`
}

type k8sServicePort struct {
	Name       string `yaml:"name"`
	Port       int    `yaml:"port"`
	TargetPort string `yaml:"targetPort"`
}

type k8sPodSpec struct {
	TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               struct {
		RunAsUser int  `yaml:"runAsUser"`
		FSGroup   *int `yaml:"fsGroup"`
	} `yaml:"securityContext"`
	InitContainers []k8sContainer `yaml:"initContainers"`
	Containers     []k8sContainer `yaml:"containers"`
	Volumes        []k8sVolume    `yaml:"volumes"`
}

type k8sVolume struct {
	Name   string `yaml:"name"`
	Secret *struct {
		SecretName  string `yaml:"secretName"`
		DefaultMode int    `yaml:"defaultMode"`
		Items       []struct{ Key, Path string }
	} `yaml:"secret"`
	PersistentVolumeClaim *struct {
		ClaimName string `yaml:"claimName"`
	} `yaml:"persistentVolumeClaim"`
}

type k8sEnvVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		FieldRef struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
	} `yaml:"valueFrom"`
}

type k8sContainerPort struct {
	Name          string `yaml:"name"`
	ContainerPort int    `yaml:"containerPort"`
}

type k8sContainer struct {
	Name           string             `yaml:"name"`
	Image          string             `yaml:"image"`
	Args           []string           `yaml:"args"`
	Env            []k8sEnvVar        `yaml:"env"`
	Ports          []k8sContainerPort `yaml:"ports"`
	ReadinessProbe struct {
		HTTPGet struct {
			Path string `yaml:"path"`
			Port string `yaml:"port"`
		} `yaml:"httpGet"`
	} `yaml:"readinessProbe"`
	Lifecycle struct {
		PreStop struct {
			Sleep struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	VolumeMounts []k8sVolumeMount `yaml:"volumeMounts"`
}

type k8sVolumeMount struct {
	Name      string `yaml:"name"`
	MountPath string `yaml:"mountPath"`
}

// readManifest decodes every object of a multi-document manifest.
func readManifest(t *testing.T, file string) []k8sObject {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	var objs []k8sObject
	for {
		var o k8sObject
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if o.Kind != "" {
			objs = append(objs, o)
		}
	}
}

func objectOf(t *testing.T, objs []k8sObject, kind string) []k8sObject {
	t.Helper()
	var out []k8sObject
	for _, o := range objs {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

// selectorLabels reads a Service's selector or a PDB's selector.matchLabels.
func selectorLabels(t *testing.T, n yaml.Node) map[string]string {
	t.Helper()
	var s struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	}
	if err := n.Decode(&s); err == nil && s.MatchLabels != nil {
		return s.MatchLabels
	}
	var flat map[string]string
	if err := n.Decode(&flat); err != nil {
		t.Fatalf("selector: %v", err)
	}
	return flat
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// serveArgs reads a container's `lockd serve` arguments as flag → value
// ("true" for a bare boolean flag), checking each against `lockd serve
// --help`, and its LOCKD_ environment variables likewise.
func serveArgs(t *testing.T, file string, c k8sContainer, flags map[string]bool) map[string]string {
	t.Helper()
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Fatalf("%s: container %s args %q: want lockd serve", file, c.Name, c.Args)
	}
	given := make(map[string]string)
	for _, arg := range c.Args[1:] {
		name, value, hasValue := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
		if !strings.HasPrefix(arg, "--") {
			t.Errorf("%s: argument %q is not a --flag=value", file, arg)
			continue
		}
		if !flags[name] {
			t.Errorf("%s: passes --%s, which lockd serve does not have", file, name)
		}
		if !hasValue {
			value = "true"
		}
		given[name] = value
	}
	for _, e := range c.Env {
		flag, ok := flagOfEnv(e.Name)
		if !ok || !flags[flag] {
			t.Errorf("%s: env %s sets no flag of lockd serve", file, e.Name)
		}
		given[flag] = e.Value
	}
	return given
}

// pathFlags are the flags of lockd serve that name files or directories.
var pathFlags = []string{"auth-file", "admin-token-file", "admin-tls-cert", "admin-tls-key", "admin-tls-client-ca", "data-dir", "tls-cert", "tls-key", "tls-client-ca", "raft-tls-cert", "raft-tls-key", "raft-tls-ca"}

// checkPod checks a lockd pod template: every flag exists, every path is
// on a mounted volume (a secret's file among its items, readable by
// lockd's user alone), ports and probes match the addresses, the drain
// fits the grace period. It returns the flags given.
func checkPod(t *testing.T, file string, spec k8sSpec, flags map[string]bool) (map[string]string, k8sContainer) {
	t.Helper()
	pod := spec.Template.Spec
	i := slices.IndexFunc(pod.Containers, func(c k8sContainer) bool { return c.Name == "lockd" })
	if i < 0 {
		t.Fatalf("%s: no container named lockd", file)
	}
	c := pod.Containers[i]
	given := serveArgs(t, file, c, flags)

	for _, flag := range pathFlags {
		p, ok := given[flag]
		if !ok {
			continue
		}
		mount := -1
		for j, m := range c.VolumeMounts {
			if p == m.MountPath || strings.HasPrefix(p, m.MountPath+"/") {
				mount = j
			}
		}
		if mount < 0 {
			t.Errorf("%s: --%s=%s is on no mounted volume", file, flag, p)
			continue
		}
		m := c.VolumeMounts[mount]
		v := slices.IndexFunc(pod.Volumes, func(v k8sVolume) bool { return v.Name == m.Name })
		if v < 0 && !slices.ContainsFunc(spec.volumeClaimNames(t, file), func(n string) bool { return n == m.Name }) {
			t.Errorf("%s: volume %s (mounted at %s) is not declared", file, m.Name, m.MountPath)
			continue
		}
		if v < 0 || pod.Volumes[v].Secret == nil {
			continue
		}
		secret := pod.Volumes[v].Secret
		rel := strings.TrimPrefix(p, m.MountPath+"/")
		if !slices.ContainsFunc(secret.Items, func(it struct{ Key, Path string }) bool { return it.Path == rel }) {
			t.Errorf("%s: --%s=%s: secret %s puts no item at %s", file, flag, p, secret.SecretName, rel)
		}
		if secret.DefaultMode != 0o400 {
			t.Errorf("%s: secret volume %s defaultMode %#o: lockd refuses a secret file the group or others can read; want 0400", file, pod.Volumes[v].Name, secret.DefaultMode)
		}
	}
	if pod.SecurityContext.FSGroup != nil {
		t.Errorf("%s: fsGroup makes the mounted auth file group-readable, which lockd refuses", file)
	}
	if pod.SecurityContext.RunAsUser != 65532 {
		t.Errorf("%s: runAsUser %d, want the image's user 65532", file, pod.SecurityContext.RunAsUser)
	}

	ports := make(map[string]int)
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for name, flag := range map[string]string{"client": "listen", "admin": "admin"} {
		host, port, err := net.SplitHostPort(given[flag])
		if err != nil || strconv.Itoa(ports[name]) != port {
			t.Errorf("%s: --%s=%s: want the container port %s (%d)", file, flag, given[flag], name, ports[name])
		}
		if host != "0.0.0.0" {
			t.Errorf("%s: --%s=%s: a pod listens on 0.0.0.0 to be reachable", file, flag, given[flag])
		}
	}
	if given["auth-file"] == "" {
		t.Errorf("%s: listening on every interface, lockd needs --auth-file", file)
	}
	if given["admin-token-file"] == "" || given["insecure-admin"] != "" {
		t.Errorf("%s: the admin port on every interface must take a bearer token (--admin-token-file), not --insecure-admin", file)
	}
	if probe := c.ReadinessProbe.HTTPGet; probe.Path != "/healthz" || probe.Port != "admin" {
		t.Errorf("%s: readiness probe %+v, want /healthz on the admin port", file, probe)
	}
	grace, err := time.ParseDuration(given["drain-grace"])
	if err != nil {
		t.Fatalf("%s: --drain-grace=%q: %v (set it, the grace period depends on it)", file, given["drain-grace"], err)
	}
	preStop := time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	if preStop <= 0 {
		t.Errorf("%s: no preStop sleep: the Services must drop the pod before it drains", file)
	}
	if total := time.Duration(pod.TerminationGracePeriodSeconds) * time.Second; total <= preStop+grace+5*time.Second {
		t.Errorf("%s: terminationGracePeriodSeconds %v leaves no room after the preStop %v and --drain-grace %v", file, total, preStop, grace)
	}
	return given, c
}

func (s k8sSpec) volumeClaimNames(t *testing.T, file string) []string {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var o struct {
			Spec struct {
				VolumeClaimTemplates []struct {
					Metadata struct{ Name string }
				} `yaml:"volumeClaimTemplates"`
			}
		}
		if err := dec.Decode(&o); err != nil {
			return names
		}
		for _, v := range o.Spec.VolumeClaimTemplates {
			names = append(names, v.Metadata.Name)
		}
	}
}

// TestKubernetesCluster checks the StatefulSet manifest against lockd and
// Kubernetes: flags and paths as above, three nodes whose --peers name
// the stable pod names of the headless Service that publishes them before
// they are ready, node ids from the pod index starting at 1, a client
// Service, and a disruption budget of one node.
func TestKubernetesCluster(t *testing.T) {
	const file = "deploy/kubernetes/cluster.yaml"
	objs := readManifest(t, file)
	sets := objectOf(t, objs, "StatefulSet")
	if len(sets) != 1 {
		t.Fatalf("%s: %d StatefulSets, want 1", file, len(sets))
	}
	sts := sets[0]
	given, c := checkPod(t, file, sts.Spec, serveFlags(t))
	labels := sts.Spec.Template.Metadata.Labels
	if given["cluster"] != "true" {
		t.Errorf("%s: no --cluster", file)
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 3 {
		t.Errorf("%s: replicas %v, want 3", file, sts.Spec.Replicas)
	}
	start := sts.Spec.Ordinals.Start
	if start != 1 {
		t.Errorf("%s: ordinals start at %d; node ids start at 1", file, start)
	}
	nodeID := slices.IndexFunc(c.Env, func(e k8sEnvVar) bool {
		return e.Name == "LOCKD_NODE_ID" && e.ValueFrom != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.labels['apps.kubernetes.io/pod-index']"
	})
	if nodeID < 0 {
		t.Errorf("%s: LOCKD_NODE_ID does not come from the pod-index label", file)
	}

	var headless *k8sObject
	raftPort := 0
	for _, svc := range objectOf(t, objs, "Service") {
		if svc.Metadata.Name == sts.Spec.ServiceName {
			headless = &svc
		}
	}
	if headless == nil {
		t.Fatalf("%s: no Service %q (the StatefulSet's serviceName)", file, sts.Spec.ServiceName)
	}
	if headless.Spec.ClusterIP != "None" || !headless.Spec.PublishNotReadyAddresses || !selects(selectorLabels(t, headless.Spec.Selector), labels) {
		t.Errorf("%s: Service %s must be headless, publish unready pods and select the StatefulSet's", file, headless.Metadata.Name)
	}
	for _, p := range headless.Spec.Ports {
		if p.TargetPort == "raft" {
			raftPort = p.Port
		}
	}
	var want []string
	for id := start; id < start+3; id++ {
		want = append(want, fmt.Sprintf("%d=%s-%d.%s:%d", id, sts.Metadata.Name, id, headless.Metadata.Name, raftPort))
	}
	if got := given["peers"]; got != strings.Join(want, ",") {
		t.Errorf("%s: --peers=%s, want %s (the pods' stable names on the headless Service's Raft port)", file, got, strings.Join(want, ","))
	}
	if !slices.ContainsFunc(c.Ports, func(p k8sContainerPort) bool {
		return p.Name == "raft" && p.ContainerPort == raftPort
	}) {
		t.Errorf("%s: the container has no port raft %d", file, raftPort)
	}

	clientService := false
	for _, svc := range objectOf(t, objs, "Service") {
		if svc.Spec.ClusterIP != "None" && selects(selectorLabels(t, svc.Spec.Selector), labels) &&
			slices.ContainsFunc(svc.Spec.Ports, func(p k8sServicePort) bool { return p.TargetPort == "client" }) {
			clientService = true
		}
	}
	if !clientService {
		t.Errorf("%s: no Service for clients selects the pods' client port", file)
	}
	pdbs := objectOf(t, objs, "PodDisruptionBudget")
	if len(pdbs) != 1 || pdbs[0].Spec.MaxUnavailable == nil || *pdbs[0].Spec.MaxUnavailable != 1 || !selects(selectorLabels(t, pdbs[0].Spec.Selector), labels) {
		t.Errorf("%s: want one PodDisruptionBudget of maxUnavailable 1 over the pods", file)
	}
}

// TestKubernetesSingle checks the single-mode Deployment likewise, and
// runs lockd with its arguments (addresses and paths moved to this
// machine): it starts and serves.
func TestKubernetesSingle(t *testing.T) {
	const file = "deploy/kubernetes/single.yaml"
	objs := readManifest(t, file)
	deps := objectOf(t, objs, "Deployment")
	if len(deps) != 1 {
		t.Fatalf("%s: %d Deployments, want 1", file, len(deps))
	}
	d := deps[0]
	given, c := checkPod(t, file, d.Spec, serveFlags(t))
	if given["cluster"] != "" {
		t.Errorf("%s: single mode passes --cluster", file)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != "Recreate" {
		t.Errorf("%s: want 1 replica replaced with Recreate (two servers must not share the data dir)", file)
	}

	// The manifest's command line, on this machine.
	dir := t.TempDir()
	addrs := freePorts(t, 2)
	moved := map[string]string{"listen": addrs[0], "admin": addrs[1]}
	for _, m := range c.VolumeMounts {
		local := filepath.Join(dir, path.Base(m.MountPath))
		if err := os.MkdirAll(local, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, flag := range pathFlags {
			if p, ok := given[flag]; ok && strings.HasPrefix(p+"/", m.MountPath+"/") {
				moved[flag] = local + strings.TrimPrefix(p, m.MountPath)
			}
		}
	}
	secrets := map[string]string{"auth-file": "billing:" + strings.Repeat("ab", 32) + "\n", "admin-token-file": strings.Repeat("cd", 32) + "\n"}
	for flag, content := range secrets {
		if err := os.WriteFile(moved[flag], []byte(content), 0o400); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"serve"}
	for _, flag := range slices.Sorted(maps.Keys(given)) {
		value := given[flag]
		if m, ok := moved[flag]; ok {
			value = m
		}
		args = append(args, "--"+flag+"="+value)
	}
	check := checkConfigContainer(t, file, d.Spec.Template.Spec, c)
	cmd := exec.Command(buildLockd(t), args...)
	cmd.Env = append(os.Environ(), podEnv(t, file, check, 1)...)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "ok (single mode)") {
		t.Fatalf("init container check-config: %v\n%s", err, out)
	}
	p := startProc(t, dir, "single-from-manifest", buildLockd(t), args...)
	p.listen, p.admin = addrs[0], addrs[1]
	eventually(t, 20*time.Second, "a greeting from lockd run with the manifest's arguments", func() (bool, string) {
		select {
		case <-p.done:
			t.Fatalf("lockd %s exited: %v", strings.Join(args, " "), p.cmd.ProcessState)
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
