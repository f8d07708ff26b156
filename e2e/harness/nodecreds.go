package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/extractedprism/extractedprism/e2e/controlplane"
	"github.com/extractedprism/extractedprism/e2e/pki"
)

// The kubelet's credentials on w1, laid out as kubeadm's kubelet leaves
// them: kubelet.conf names kubelet-client-current.pem, a symlink to the
// newest kubelet-client-<n>.pem, which holds certificate and key. Node mode
// runs discovery (and the readyz probe) with them.
const (
	nodeName         = "w1"
	nodeCertValidity = 24 * time.Hour
)

func (c *Cluster) nodePKIDir() string { return filepath.Join(c.Dir, "kubelet-pki") }
func (c *Cluster) nodeCertPath() string {
	return filepath.Join(c.nodePKIDir(), "kubelet-client-current.pem")
}
func (c *Cluster) nodeCachePath() string {
	return filepath.Join(c.Dir, "node-endpoints.json")
}

// RotateNodeCert issues w1 a new key pair and certificate, valid until
// notAfter, and points kubelet-client-current.pem at it as the kubelet's
// rotation does: a new file, then the symlink replaced in one rename.
func (c *Cluster) RotateNodeCert(notAfter time.Time) error {
	dir := c.nodePKIDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	c.mu.Lock()
	c.nodeCerts++
	n := c.nodeCerts
	c.mu.Unlock()
	name := "kubelet-client-" + strconv.Itoa(n) + ".pem"
	if err := c.CA.NodeClient(filepath.Join(dir, name), nodeName, notAfter); err != nil {
		return fmt.Errorf("node certificate: %w", err)
	}
	tmp := filepath.Join(dir, ".kubelet-client-current.pem.tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(name, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, c.nodeCertPath())
}

// nodeKubeconfig writes (once) w1's kubelet.conf: the cluster CA, a server
// extractedprism replaces with its own listener, and the rotating
// certificate as client-certificate and client-key.
func (c *Cluster) nodeKubeconfig() string {
	path := filepath.Join(c.Dir, "kubelet.conf")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	cert := c.nodeCertPath()
	if err := controlplane.WriteKubeconfig(path, "https://192.0.2.254:1", "", c.CA.CertFile(), pki.Pair{Cert: cert, Key: cert}); err != nil {
		c.logf("writing %s: %v", path, err)
	}
	return path
}

// prepareNode gives a node-mode row fresh credentials valid until
// notAfter, an empty endpoint cache and the RBAC of
// deploy/node-discovery-rbac.yaml.
func (c *Cluster) prepareNode(ctx context.Context, notAfter time.Time) error {
	if err := c.RotateNodeCert(notAfter); err != nil {
		return err
	}
	if err := os.Remove(c.nodeCachePath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := c.NodeRBAC(ctx, true); err != nil {
		return err
	}
	return c.WaitNodeAccess(ctx, true)
}

// WaitNodeAccess waits until every API server of cp1-cp3 allows (or
// refuses with 403) w1's node credentials a List of the kubernetes
// EndpointSlices, as discovery makes it: a change of the RoleBinding
// reaches each server's authorizer through its informer, a moment later.
func (c *Cluster) WaitNodeAccess(ctx context.Context, allowed bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, name := range CPNames {
		cfg := c.RESTConfig(APIAddr(name), "")
		cfg.CertFile, cfg.KeyFile = c.nodeCertPath(), c.nodeCertPath()
		cfg.Timeout = 5 * time.Second
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return err
		}
		slices := cs.DiscoveryV1().EndpointSlices("default")
		for {
			_, err := slices.List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kubernetes"})
			if (allowed && err == nil) || (!allowed && apierrors.IsForbidden(err)) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s: node credentials allowed %v: last answer %v", name, !allowed, err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

// NodeRBAC creates the Role and RoleBinding of the shipped manifest
// deploy/node-discovery-rbac.yaml, or (on false) deletes the RoleBinding.
func (c *Cluster) NodeRBAC(ctx context.Context, on bool) error {
	role, binding, err := nodeRBACObjects()
	if err != nil {
		return err
	}
	cs, err := c.DirectClient()
	if err != nil {
		return err
	}
	rbac := cs.RbacV1()
	if !on {
		err := rbac.RoleBindings(binding.Namespace).Delete(ctx, binding.Name, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	if _, err := rbac.Roles(role.Namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Role: %w", err)
	}
	if _, err := rbac.RoleBindings(binding.Namespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create RoleBinding: %w", err)
	}
	return nil
}

// nodeRBACObjects reads the Role and the RoleBinding from the manifest.
func nodeRBACObjects() (*rbacv1.Role, *rbacv1.RoleBinding, error) {
	path, err := sourceFile("deploy", "node-discovery-rbac.yaml")
	if err != nil {
		return nil, nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var role rbacv1.Role
	var binding rbacv1.RoleBinding
	for doc := range bytes.SplitSeq(data, []byte("\n---\n")) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		switch meta.Kind {
		case "Role":
			err = yaml.UnmarshalStrict(doc, &role)
		case "RoleBinding":
			err = yaml.UnmarshalStrict(doc, &binding)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	if role.Name == "" || binding.Name == "" {
		return nil, nil, fmt.Errorf("%s: want a Role and a RoleBinding", path)
	}
	return &role, &binding, nil
}

// sourceFile is the path of a file of the extractedprism repository, found
// from the working directory up.
func sourceFile(elem ...string) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	src, err := FindSource(wd)
	if err != nil {
		return "", err
	}
	return filepath.Join(append([]string{src}, elem...)...), nil
}
