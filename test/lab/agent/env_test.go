package agent

import (
	"context"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestExpand(t *testing.T) {
	env := map[string]string{"A": "1", "B": "two", "EMPTY": ""}
	for in, want := range map[string]string{
		"":                "",
		"plain":           "plain",
		"$(A)":            "1",
		"x$(A)y$(B)z":     "x1ytwoz",
		"$$(A)":           "$(A)",
		"$$":              "$",
		"$(MISSING)":      "$(MISSING)",
		"$(EMPTY)x":       "x",
		"$(A":             "$(A",
		"$()":             "$()",
		"$A":              "$A",
		"a$":              "a$",
		"$($(A))":         "$($(A))",
		"--ip=$(A):$(B)$": "--ip=1:two$",
	} {
		if got := Expand(in, env); got != want {
			t.Errorf("Expand(%q) = %q, want %q", in, got, want)
		}
	}
}

// mapSource serves Secrets and ConfigMaps from maps, for the pure env logic.
type mapSource struct {
	secrets    map[string]*corev1.Secret
	configMaps map[string]*corev1.ConfigMap
}

func (m mapSource) Secret(_ context.Context, ns, name string) (*corev1.Secret, error) {
	if s, ok := m.secrets[ns+"/"+name]; ok {
		return s, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
}

func (m mapSource) ConfigMap(_ context.Context, ns, name string) (*corev1.ConfigMap, error) {
	if c, ok := m.configMaps[ns+"/"+name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, name)
}

func testPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "speaker-x7", Namespace: "metallb-system", UID: "1234abcd-0000-0000-0000-000000000000", Labels: map[string]string{"app": "speaker"}},
		Spec:       corev1.PodSpec{NodeName: "myk8s-worker", ServiceAccountName: "speaker"},
		Status: corev1.PodStatus{
			HostIP: "172.18.0.3", HostIPs: []corev1.HostIP{{IP: "172.18.0.3"}},
			PodIP: "10.10.1.2", PodIPs: []corev1.PodIP{{IP: "10.10.1.2"}},
		},
	}
}

func TestResolveEnv(t *testing.T) {
	src := mapSource{
		secrets: map[string]*corev1.Secret{
			"metallb-system/memberlist": {Data: map[string][]byte{"secretkey": []byte("s3cret")}},
			"metallb-system/all":        {Data: map[string][]byte{"X": []byte("from-secret"), "Y": []byte("y")}},
		},
		configMaps: map[string]*corev1.ConfigMap{
			"metallb-system/cfg": {Data: map[string]string{"level": "debug", "X": "from-cm"}},
		},
	}
	opt := true
	c := &corev1.Container{
		Name: "speaker",
		EnvFrom: []corev1.EnvFromSource{
			{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}},
			{Prefix: "S_", SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "all"}}},
			{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "missing"}, Optional: &opt}},
		},
		Env: []corev1.EnvVar{
			{Name: "METALLB_NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
			{Name: "METALLB_HOST", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
			{Name: "POD_IPS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIPs"}}},
			{Name: "NS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
			{Name: "APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
			{Name: "SA", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.serviceAccountName"}}},
			{Name: "METALLB_ML_SECRET_KEY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "memberlist"}, Key: "secretkey"}}},
			{Name: "LEVEL", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Key: "level"}}},
			{Name: "OPTIONAL", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "memberlist"}, Key: "nope", Optional: &opt}}},
			{Name: "BIND", Value: "$(METALLB_HOST):7946"},
			{Name: "X", Value: "explicit"},
			{Name: "CPU", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu"}}},
		},
	}
	base := NewEnv()
	base.Set("HOSTNAME", "speaker-x7")
	alloc := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
	env, err := ResolveEnv(context.Background(), testPod(), c, base, src, alloc)
	if err != nil {
		t.Fatalf("ResolveEnv: %v", err)
	}
	want := []string{
		"HOSTNAME=speaker-x7",
		"X=explicit", // envFrom ConfigMap defined it first; env replaced it in place
		"level=debug",
		"S_X=from-secret",
		"S_Y=y",
		"METALLB_NODE_NAME=myk8s-worker",
		"METALLB_HOST=172.18.0.3",
		"POD_IPS=10.10.1.2",
		"NS=metallb-system",
		"APP=speaker",
		"SA=speaker",
		"METALLB_ML_SECRET_KEY=s3cret",
		"LEVEL=debug",
		"BIND=172.18.0.3:7946",
		"CPU=2",
	}
	if got := env.List(); !reflect.DeepEqual(got, want) {
		t.Errorf("env =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestResolveEnvErrors(t *testing.T) {
	src := mapSource{secrets: map[string]*corev1.Secret{"metallb-system/memberlist": {Data: map[string][]byte{}}}}
	for name, ev := range map[string]corev1.EnvVar{
		"missing secret": {Name: "K", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Key: "k"}}},
		"missing key":    {Name: "K", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "memberlist"}, Key: "secretkey"}}},
		"bad fieldPath":  {Name: "K", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.bogus"}}},
	} {
		c := &corev1.Container{Env: []corev1.EnvVar{ev}}
		_, err := ResolveEnv(context.Background(), testPod(), c, nil, src, nil)
		if err == nil {
			t.Errorf("%s: want an error", name)
			continue
		}
		if !strings.Contains(err.Error(), "env K") {
			t.Errorf("%s: error %q does not name the variable", name, err)
		}
	}
}
