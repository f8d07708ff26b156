package test

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// checkContainer returns the check Job's only container.
func checkContainer(t *testing.T, m *manifest) *corev1.Container {
	t.Helper()
	if m.CheckJob == nil {
		t.Fatal("no check Job rendered")
	}
	pod := m.CheckJob.Spec.Template.Spec
	if len(pod.InitContainers) != 0 || len(pod.Containers) != 1 {
		t.Fatalf("check Job: %d init containers, %d containers; want 0 and 1", len(pod.InitContainers), len(pod.Containers))
	}
	return &pod.Containers[0]
}

// hookCommand returns the check Job's container as the kubelet starts it
// from the image, whose entrypoint is the daemon: its arguments and its
// environment. Only literal values resolve here; an entry from the
// downward API or a Secret fails the test, as only a kubelet could give it
// a value.
func hookCommand(t *testing.T, m *manifest) (args, env []string) {
	t.Helper()
	c := checkContainer(t, m)
	if len(c.Command) != 0 || len(c.EnvFrom) != 0 {
		t.Fatalf("check container: command %v, envFrom %v; want the image's entrypoint and env entries only", c.Command, c.EnvFrom)
	}
	// Not nil: exec.Cmd would read a nil Env as the test's own environment.
	env = []string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			t.Fatalf("check container: env %s is set from %+v, which only a kubelet resolves", e.Name, *e.ValueFrom)
		}
		env = append(env, e.Name+"="+e.Value)
	}
	return c.Args, env
}

// checkRun is what one run of the check hook's command left.
type checkRun struct {
	exitCode       int
	stdout, stderr string
}

// runCheck runs the daemon with the check Job's arguments and environment
// and nothing of the test's environment, so that an EP_ variable set where
// the tests run cannot change the verdict.
func runCheck(t *testing.T, m *manifest) checkRun {
	t.Helper()
	args, env := hookCommand(t, m)
	return runDaemon(t, args, env)
}

// runDaemon runs the daemon of the pinned release with args and env alone,
// for a command that ends by itself, such as check.
func runDaemon(t *testing.T, args, env []string) checkRun {
	t.Helper()
	// Built before the bound starts: the first build of a run may take
	// longer than the check ever should.
	bin := daemonBinary(t)
	const bound = 30 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	// Never nil, which exec.Cmd reads as the test's own environment.
	cmd.Env = append([]string{}, env...)
	cmd.Dir = t.TempDir()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("extractedprism %s did not end within %v", strings.Join(args, " "), bound)
	}
	if exitErr := (*exec.ExitError)(nil); err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("run extractedprism %s: %v", strings.Join(args, " "), err)
	}
	return checkRun{exitCode: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

// checkPasses runs the check hook's command and fails the test unless the
// daemon accepts the configuration; it returns what the daemon printed,
// warnings included.
func checkPasses(t *testing.T, m *manifest) string {
	t.Helper()
	r := runCheck(t, m)
	if r.exitCode != 0 || !strings.Contains(r.stdout, "extractedprism check: configuration is valid") {
		t.Errorf("check hook: exit %d, stdout %q, stderr %q; want exit 0 and the configuration valid", r.exitCode, r.stdout, r.stderr)
	}
	return r.stdout
}

// checkFails runs the check hook's command and fails the test unless the
// daemon refuses the configuration, exiting 1 with its one error line on
// stderr and each of want in it.
func checkFails(t *testing.T, m *manifest, want ...string) {
	t.Helper()
	r := runCheck(t, m)
	if r.exitCode != 1 || !strings.HasPrefix(r.stderr, "extractedprism: ") {
		t.Errorf("check hook: exit %d, stdout %q, stderr %q; want exit 1 and the daemon's message", r.exitCode, r.stdout, r.stderr)
		return
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("check hook message does not mention %q:\n%s", w, r.stderr)
		}
	}
}

// checkHookJob checks the check Job against the DaemonSet it vouches for:
// the same image and environment, on the same nodes, as a Helm hook that
// fails at once and shows the daemon's message, with nothing the check does
// not need.
func checkHookJob(t *testing.T, m *manifest) {
	t.Helper()
	job, ds := m.CheckJob, m.DaemonSet
	if job.Namespace != ds.Namespace {
		t.Errorf("check Job namespace = %q; want the DaemonSet's %q", job.Namespace, ds.Namespace)
	}
	for key, want := range map[string]string{
		"helm.sh/hook": "pre-install,pre-upgrade",
		// Deleted once it passed, and before a rerun creates it again; a
		// failed one stays to be read.
		"helm.sh/hook-delete-policy":     "before-hook-creation,hook-succeeded",
		"helm.sh/hook-output-log-policy": "hook-failed",
	} {
		if got := job.Annotations[key]; got != want {
			t.Errorf("check Job annotation %s = %q; want %q", key, got, want)
		}
	}
	spec := job.Spec
	if spec.BackoffLimit == nil || *spec.BackoffLimit != 0 {
		t.Errorf("backoffLimit = %s; want 0: a rerun reads the same values", show(spec.BackoffLimit))
	}
	// Below helm's default --timeout of 5 minutes, so that helm reports the
	// Job's failure rather than its own timeout.
	if d := spec.ActiveDeadlineSeconds; d == nil || *d <= 0 || *d >= 300 {
		t.Errorf("activeDeadlineSeconds = %s; want a bound below helm's 300 s timeout", show(d))
	}

	pod, dsPod := spec.Template.Spec, ds.Spec.Template.Spec
	c, dsc := checkContainer(t, m), container(t, m)
	if pod.SecurityContext == nil || c.SecurityContext == nil {
		t.Fatalf("check pod securityContext %v, container %v; want both", pod.SecurityContext, c.SecurityContext)
	}
	if pod.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restartPolicy = %q; want Never", pod.RestartPolicy)
	}
	// The chart's ServiceAccount does not exist yet at pre-install.
	if pod.ServiceAccountName != "" || pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("serviceAccountName %q, automountServiceAccountToken %s; want the namespace's default account and no token",
			pod.ServiceAccountName, show(pod.AutomountServiceAccountToken))
	}
	if !pod.HostNetwork || pod.DNSPolicy != corev1.DNSDefault {
		t.Errorf("hostNetwork %v, dnsPolicy %q; want the DaemonSet's true and Default: the check must run before the CNI plugin works", pod.HostNetwork, pod.DNSPolicy)
	}
	if !equality.Semantic.DeepEqual(pod.Tolerations, dsPod.Tolerations) || !equality.Semantic.DeepEqual(pod.NodeSelector, dsPod.NodeSelector) ||
		!equality.Semantic.DeepEqual(pod.Affinity, dsPod.Affinity) || !equality.Semantic.DeepEqual(pod.ImagePullSecrets, dsPod.ImagePullSecrets) {
		t.Errorf("check pod tolerations %v, nodeSelector %v, affinity %v, imagePullSecrets %v; want the DaemonSet's %v, %v, %v, %v",
			pod.Tolerations, pod.NodeSelector, pod.Affinity, pod.ImagePullSecrets, dsPod.Tolerations, dsPod.NodeSelector, dsPod.Affinity, dsPod.ImagePullSecrets)
	}
	if len(pod.Volumes) != 0 {
		t.Errorf("check pod volumes = %v; want none", pod.Volumes)
	}
	selected := true
	for k, v := range ds.Spec.Selector.MatchLabels {
		selected = selected && spec.Template.Labels[k] == v
	}
	if selected {
		t.Errorf("check pod labels %v match the DaemonSet's selector %v", spec.Template.Labels, ds.Spec.Selector.MatchLabels)
	}

	// The DaemonSet's extraArgs after the subcommand, so the check judges
	// the flags the daemon will start with.
	if want := append([]string{"check"}, dsc.Args...); !slices.Equal(c.Args, want) || len(c.Command) != 0 {
		t.Errorf("check container command %v, args %v; want the image's entrypoint with %v", c.Command, c.Args, want)
	}
	if c.Image != dsc.Image || c.ImagePullPolicy != dsc.ImagePullPolicy {
		t.Errorf("check image %q (%s); want the DaemonSet's %q (%s)", c.Image, c.ImagePullPolicy, dsc.Image, dsc.ImagePullPolicy)
	}
	if !equality.Semantic.DeepEqual(c.Env, dsc.Env) {
		t.Errorf("check env = %v; want the DaemonSet's %v", c.Env, dsc.Env)
	}
	if !equality.Semantic.DeepEqual(c.Resources, dsc.Resources) {
		t.Errorf("check resources = %v; want the DaemonSet's %v", c.Resources, dsc.Resources)
	}
	if c.TerminationMessagePolicy != corev1.TerminationMessageFallbackToLogsOnError {
		t.Errorf("terminationMessagePolicy = %q; want FallbackToLogsOnError, so the daemon's message shows in the pod's status", c.TerminationMessagePolicy)
	}
	if len(c.VolumeMounts) != 0 || len(c.Ports) != 0 || c.LivenessProbe != nil || c.ReadinessProbe != nil {
		t.Errorf("check container mounts %v, ports %v, probes %v %v; want none", c.VolumeMounts, c.Ports, c.LivenessProbe, c.ReadinessProbe)
	}
	for _, sc := range []struct {
		where        string
		uid, gid     *int64
		runAsNonRoot *bool
	}{
		{"check pod", pod.SecurityContext.RunAsUser, pod.SecurityContext.RunAsGroup, pod.SecurityContext.RunAsNonRoot},
		{"check container", c.SecurityContext.RunAsUser, c.SecurityContext.RunAsGroup, c.SecurityContext.RunAsNonRoot},
	} {
		if sc.uid == nil || *sc.uid != daemonUID || sc.gid == nil || *sc.gid != daemonUID || !boolValue(sc.runAsNonRoot) {
			t.Errorf("%s runs as %s:%s (runAsNonRoot %s); want %d:%d, non-root", sc.where, show(sc.uid), show(sc.gid), show(sc.runAsNonRoot), daemonUID, daemonUID)
		}
	}
	csc := c.SecurityContext
	if !boolValue(csc.ReadOnlyRootFilesystem) || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation ||
		csc.Privileged == nil || *csc.Privileged || csc.Capabilities == nil ||
		!slices.Equal(csc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(csc.Capabilities.Add) != 0 ||
		csc.SeccompProfile == nil || csc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("check container securityContext = %+v; want a read-only root, no privilege, every capability dropped, seccomp RuntimeDefault", csc)
	}
}
