package agent

import (
	"context"
	"fmt"
	"math"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Expand replaces $(VAR) references in s with their values from env, as the
// kubelet does for command, args and env values: "$$" is an escaped "$", and a
// reference to an unknown variable is left as written.
func Expand(s string, env map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '$' && i+1 < len(s) {
			switch s[i+1] {
			case '$':
				b.WriteByte('$')
				i++
				continue
			case '(':
				if j := strings.IndexByte(s[i+2:], ')'); j > 0 {
					name := s[i+2 : i+2+j]
					if v, ok := env[name]; ok {
						b.WriteString(v)
					} else {
						b.WriteString(s[i : i+3+j])
					}
					i += 2 + j
					continue
				}
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ExpandAll expands every element of in; nil stays nil.
func ExpandAll(in []string, env map[string]string) []string {
	if in == nil {
		return nil
	}
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = Expand(s, env)
	}
	return out
}

// ObjectSource reads the Secrets and ConfigMaps that env and volumes refer to.
type ObjectSource interface {
	Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error)
	ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error)
}

// Env is an ordered environment: later Set calls of a name replace its value
// in place.
type Env struct {
	names  []string
	values map[string]string
}

// NewEnv returns an empty environment.
func NewEnv() *Env { return &Env{values: map[string]string{}} }

// Set defines or replaces name.
func (e *Env) Set(name, value string) {
	if _, ok := e.values[name]; !ok {
		e.names = append(e.names, name)
	}
	e.values[name] = value
}

// Map returns the variables as a map (shared, do not modify).
func (e *Env) Map() map[string]string { return e.values }

// List returns the variables as NAME=value strings in definition order.
func (e *Env) List() []string {
	out := make([]string, 0, len(e.names))
	for _, n := range e.names {
		out = append(out, n+"="+e.values[n])
	}
	return out
}

// ResolveEnv computes a container's environment the way the kubelet does:
// base variables first, then envFrom sources in order, then env entries in
// order; env values may refer to variables defined before them with $(VAR).
// pod must carry the status (podIP, hostIP) the container will see.
func ResolveEnv(ctx context.Context, pod *corev1.Pod, c *corev1.Container, base *Env, src ObjectSource, nodeAllocatable corev1.ResourceList) (*Env, error) {
	env := NewEnv()
	if base != nil {
		for _, n := range base.names {
			env.Set(n, base.values[n])
		}
	}
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm, err := src.ConfigMap(ctx, pod.Namespace, from.ConfigMapRef.Name)
			if err != nil {
				if apierrors.IsNotFound(err) && isTrue(from.ConfigMapRef.Optional) {
					continue
				}
				return nil, fmt.Errorf("envFrom configMapRef %s/%s: %w", pod.Namespace, from.ConfigMapRef.Name, err)
			}
			for _, k := range sortedKeys(cm.Data) {
				env.Set(from.Prefix+k, cm.Data[k])
			}
		case from.SecretRef != nil:
			s, err := src.Secret(ctx, pod.Namespace, from.SecretRef.Name)
			if err != nil {
				if apierrors.IsNotFound(err) && isTrue(from.SecretRef.Optional) {
					continue
				}
				return nil, fmt.Errorf("envFrom secretRef %s/%s: %w", pod.Namespace, from.SecretRef.Name, err)
			}
			for _, k := range sortedKeys(s.Data) {
				env.Set(from.Prefix+k, string(s.Data[k]))
			}
		}
	}
	for _, ev := range c.Env {
		if ev.ValueFrom == nil {
			env.Set(ev.Name, Expand(ev.Value, env.Map()))
			continue
		}
		v, skip, err := resolveEnvSource(ctx, pod, c, ev, src, nodeAllocatable)
		if err != nil {
			return nil, err
		}
		if !skip {
			env.Set(ev.Name, v)
		}
	}
	return env, nil
}

func resolveEnvSource(ctx context.Context, pod *corev1.Pod, c *corev1.Container, ev corev1.EnvVar, src ObjectSource, alloc corev1.ResourceList) (value string, skip bool, err error) {
	vf := ev.ValueFrom
	switch {
	case vf.FieldRef != nil:
		v, err := FieldValue(pod, vf.FieldRef.FieldPath)
		if err != nil {
			return "", false, fmt.Errorf("env %s: %w", ev.Name, err)
		}
		return v, false, nil
	case vf.ResourceFieldRef != nil:
		v, err := resourceValue(c, vf.ResourceFieldRef, alloc)
		if err != nil {
			return "", false, fmt.Errorf("env %s: %w", ev.Name, err)
		}
		return v, false, nil
	case vf.SecretKeyRef != nil:
		ref := vf.SecretKeyRef
		s, err := src.Secret(ctx, pod.Namespace, ref.Name)
		if err != nil {
			if apierrors.IsNotFound(err) && isTrue(ref.Optional) {
				return "", true, nil
			}
			return "", false, fmt.Errorf("env %s: secretKeyRef %s/%s: %w", ev.Name, pod.Namespace, ref.Name, err)
		}
		b, ok := s.Data[ref.Key]
		if !ok {
			if isTrue(ref.Optional) {
				return "", true, nil
			}
			return "", false, fmt.Errorf("env %s: couldn't find key %s in Secret %s/%s", ev.Name, ref.Key, pod.Namespace, ref.Name)
		}
		return string(b), false, nil
	case vf.ConfigMapKeyRef != nil:
		ref := vf.ConfigMapKeyRef
		cm, err := src.ConfigMap(ctx, pod.Namespace, ref.Name)
		if err != nil {
			if apierrors.IsNotFound(err) && isTrue(ref.Optional) {
				return "", true, nil
			}
			return "", false, fmt.Errorf("env %s: configMapKeyRef %s/%s: %w", ev.Name, pod.Namespace, ref.Name, err)
		}
		v, ok := cm.Data[ref.Key]
		if !ok {
			if bv, ok2 := cm.BinaryData[ref.Key]; ok2 {
				return string(bv), false, nil
			}
			if isTrue(ref.Optional) {
				return "", true, nil
			}
			return "", false, fmt.Errorf("env %s: couldn't find key %s in ConfigMap %s/%s", ev.Name, ref.Key, pod.Namespace, ref.Name)
		}
		return v, false, nil
	}
	return "", false, fmt.Errorf("env %s: valueFrom has no supported source", ev.Name)
}

// FieldValue returns the value of a downward-API field path of pod.
func FieldValue(pod *corev1.Pod, path string) (string, error) {
	if k, ok := subscript(path, "metadata.labels"); ok {
		return pod.Labels[k], nil
	}
	if k, ok := subscript(path, "metadata.annotations"); ok {
		return pod.Annotations[k], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP":
		return pod.Status.HostIP, nil
	case "status.hostIPs":
		return joinIPs(pod.Status.HostIPs, func(i corev1.HostIP) string { return i.IP }), nil
	case "status.podIP":
		return pod.Status.PodIP, nil
	case "status.podIPs":
		return joinIPs(pod.Status.PodIPs, func(i corev1.PodIP) string { return i.IP }), nil
	}
	return "", fmt.Errorf("unsupported fieldRef fieldPath %q", path)
}

func subscript(path, prefix string) (string, bool) {
	if !strings.HasPrefix(path, prefix+"['") || !strings.HasSuffix(path, "']") {
		return "", false
	}
	return path[len(prefix)+2 : len(path)-2], true
}

func formatMap(m map[string]string) string {
	var lines []string
	for _, k := range sortedKeys(m) {
		lines = append(lines, fmt.Sprintf("%s=%q", k, m[k]))
	}
	return strings.Join(lines, "\n")
}

func joinIPs[T any](ips []T, ip func(T) string) string {
	out := make([]string, len(ips))
	for i, x := range ips {
		out[i] = ip(x)
	}
	return strings.Join(out, ",")
}

func resourceValue(c *corev1.Container, ref *corev1.ResourceFieldSelector, alloc corev1.ResourceList) (string, error) {
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok || (kind != "limits" && kind != "requests") {
		return "", fmt.Errorf("unsupported resourceFieldRef resource %q", ref.Resource)
	}
	rn := corev1.ResourceName(name)
	var q resource.Quantity
	var have bool
	if kind == "limits" {
		q, have = c.Resources.Limits[rn]
		if !have {
			q, have = alloc[rn]
		}
	} else {
		q, have = c.Resources.Requests[rn]
	}
	if !have {
		return "0", nil
	}
	div := ref.Divisor
	if div.IsZero() {
		div = resource.MustParse("1")
	}
	// Round up, as the kubelet does (a request of 250m cpu is "1" with divisor 1).
	v := math.Ceil(float64(q.MilliValue()) / float64(div.MilliValue()))
	return fmt.Sprintf("%d", int64(v)), nil
}

func isTrue(b *bool) bool { return b != nil && *b }

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sortStrings(out)
	return out
}
