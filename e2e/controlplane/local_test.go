package controlplane_test

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/extractedprism/extractedprism/e2e/controlplane"
)

// TestLocalServerSideDryRunApply is the example for tests that need a real
// API server: a server-side apply with dryRun=All is validated and
// defaulted by the API server but not stored.
func TestLocalServerSideDryRunApply(t *testing.T) {
	l := controlplane.ForTest(t)
	cs, err := kubernetes.NewForConfig(l.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	manifest := []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"dry","namespace":"default"},"data":{"k":"v"}}`)
	got, err := cs.CoreV1().ConfigMaps("default").Patch(ctx, "dry", types.ApplyPatchType, manifest, metav1.PatchOptions{
		FieldManager: "e2e",
		DryRun:       []string{metav1.DryRunAll},
	})
	if err != nil {
		t.Fatalf("dry-run apply: %v", err)
	}
	if got.Data["k"] != "v" || got.UID == "" {
		t.Errorf("dry-run apply returned %+v; want the object with data k=v and a UID", got)
	}
	if _, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "dry", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("get after dry-run apply: got %v; want NotFound", err)
	}

	bad := []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"Not_Valid","namespace":"default"}}`)
	_, err = cs.CoreV1().ConfigMaps("default").Patch(ctx, "Not_Valid", types.ApplyPatchType, bad, metav1.PatchOptions{
		FieldManager: "e2e",
		DryRun:       []string{metav1.DryRunAll},
	})
	if !apierrors.IsInvalid(err) {
		t.Errorf("dry-run apply of an invalid name: got %v; want Invalid", err)
	}
}
