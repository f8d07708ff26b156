package harness

import (
	"slices"
	"testing"
)

// TestNodeRBACManifest reads deploy/node-discovery-rbac.yaml as the node
// rows apply it: a Role in default allowing list and watch of
// EndpointSlices and nothing else, bound to the group system:nodes.
func TestNodeRBACManifest(t *testing.T) {
	role, binding, err := nodeRBACObjects()
	if err != nil {
		t.Fatal(err)
	}
	if role.Namespace != "default" || len(role.Rules) != 1 {
		t.Fatalf("Role %s/%s with %d rules; want one rule in default", role.Namespace, role.Name, len(role.Rules))
	}
	r := role.Rules[0]
	if !slices.Equal(r.APIGroups, []string{"discovery.k8s.io"}) || !slices.Equal(r.Resources, []string{"endpointslices"}) ||
		!slices.Equal(r.Verbs, []string{"list", "watch"}) || len(r.ResourceNames) > 0 {
		t.Errorf("rule %+v; want list and watch of discovery.k8s.io endpointslices", r)
	}
	if binding.Namespace != "default" || binding.RoleRef.Kind != "Role" || binding.RoleRef.Name != role.Name {
		t.Errorf("RoleBinding %s/%s refers to %s %s; want the Role %s in default", binding.Namespace, binding.Name,
			binding.RoleRef.Kind, binding.RoleRef.Name, role.Name)
	}
	if len(binding.Subjects) != 1 || binding.Subjects[0].Kind != "Group" || binding.Subjects[0].Name != "system:nodes" {
		t.Errorf("subjects %+v; want the group system:nodes alone", binding.Subjects)
	}
}

// TestDiscoveryNotRunningExpr: the forbidden row checks the alert by its
// expression, so it must be one the row can read off a scrape.
func TestDiscoveryNotRunningExpr(t *testing.T) {
	expr, err := alertExpr("ExtractedprismDiscoveryNotRunning")
	if err != nil {
		t.Fatal(err)
	}
	if want := mDiscoveryRunning + `{provider="kubernetes"} == 0`; expr != want {
		t.Errorf("expr %q; want %q", expr, want)
	}
}
