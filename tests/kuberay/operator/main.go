// kuberay-pods runs KubeRay's real RayCluster operator code (RayClusterReconciler from
// github.com/ray-project/kuberay/ray-operator v1.5.0) against an in-memory fake
// Kubernetes client and prints the Pods and Services it creates for a RayCluster.
//
//	kuberay-pods --cluster FILE.yaml [--existing PODS.json] [--namespace default]
//
// stdout: one JSON object {"pods": [corev1.Pod...], "services": [corev1.Service...]},
// every Pod and Service in the RayCluster's namespace, sorted by name.
// stderr: diagnostics only (reconcile errors, KubeRay's events, a per-call summary).
// Set KUBERAY_PODS_LOG=info (or debug) to also get the operator's own log on stderr.
//
// Like the real operator, the reconciler reads its environment (e.g.
// ENABLE_INIT_CONTAINER_INJECTION, ENABLE_DETERMINISTIC_HEAD_POD_NAME,
// ENABLE_RAY_HEAD_CLUSTER_IP_SERVICE); all are left at KubeRay's defaults unless the
// caller sets them. No feature gate is changed: RayClusterStatusConditions=true,
// RayMultiHostIndexing=false, ... as KubeRay v1.5.0 ships them (KUBERAY_FEATURE_GATES,
// in the operator's --feature-gates syntax, overrides them for experiments).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/google/uuid"
	routev1 "github.com/openshift/api/route/v1"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/yaml"

	configapi "github.com/ray-project/kuberay/ray-operator/apis/config/v1alpha1"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/batchscheduler"
)

const maxReconcileCalls = 20

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kuberay-pods: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	clusterFile := flag.String("cluster", "", "RayCluster manifest (YAML, one ray.io/v1 RayCluster)")
	existingFile := flag.String("existing", "", "JSON array of corev1.Pod objects to load as running before reconciling")
	namespace := flag.String("namespace", "default", "namespace for the RayCluster if its manifest sets none")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: kuberay-pods --cluster FILE.yaml [--existing PODS.json] [--namespace default]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 0 {
		flag.Usage()
		fatalf("unexpected arguments: %q", flag.Args())
	}
	if *clusterFile == "" {
		flag.Usage()
		fatalf("--cluster is required")
	}
	if *namespace == "" {
		fatalf("--namespace must not be empty")
	}

	setupLogger()

	// KubeRay's feature gates stay at their v1.5.0 defaults. KUBERAY_FEATURE_GATES takes
	// the operator's --feature-gates syntax (e.g. RayMultiHostIndexing=true) for experiments.
	if gates := os.Getenv("KUBERAY_FEATURE_GATES"); gates != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(gates); err != nil {
			fatalf("KUBERAY_FEATURE_GATES=%q: %v", gates, err)
		}
		fmt.Fprintf(os.Stderr, "kuberay-pods: feature gates set: %s\n", gates)
	}

	cluster, err := loadRayCluster(*clusterFile)
	if err != nil {
		fatalf("%v", err)
	}
	if cluster.Namespace == "" {
		cluster.Namespace = *namespace
	}
	// What the API server would fill in on create.
	if cluster.UID == "" {
		cluster.UID = types.UID(uuid.NewSHA1(uuid.NameSpaceURL,
			[]byte("ray.io/v1/RayCluster/"+cluster.Namespace+"/"+cluster.Name)).String())
	}
	if cluster.Generation == 0 {
		cluster.Generation = 1
	}
	if cluster.CreationTimestamp.IsZero() {
		cluster.CreationTimestamp = metav1.Now()
	}

	var existing []corev1.Pod
	if *existingFile != "" {
		existing, err = loadPods(*existingFile, cluster.Namespace)
		if err != nil {
			fatalf("%v", err)
		}
	}

	// The scheme of KubeRay's main.go: client-go (core, batch, networking, coordination,
	// rbac, ...), rayv1, OpenShift routes, batch/v1, and the operator's config API.
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(rayv1.AddToScheme(scheme))
	utilruntime.Must(routev1.Install(scheme))
	utilruntime.Must(configapi.AddToScheme(scheme))

	ips := newIPAllocator()
	for i := range existing {
		ips.reserve(existing[i].Status.PodIP)
	}
	initObjs := []client.Object{cluster}
	for i := range existing {
		markRunning(&existing[i], ips)
		initObjs = append(initObjs, &existing[i])
	}

	recorder := record.NewFakeRecorder(100000)
	mgr := &fakeManager{
		scheme: scheme,
		// Pods and Services get their status subresource from the fake client's
		// in-tree defaults; the RayCluster CRD has one too (KubeRay updates it with
		// Status().Update).
		builder: fake.NewClientBuilder().
			WithScheme(scheme).
			WithStatusSubresource(&rayv1.RayCluster{}).
			WithObjects(initObjs...),
		recorder: recorder,
	}

	ctx := context.Background()

	// The options KubeRay's main.go builds with its default flags/config:
	// no sidecars, not OpenShift, metrics off (nil manager), and the batch scheduler
	// manager for an empty config (the no-op default scheduler).
	var config configapi.Configuration
	configapi.SetDefaults_Configuration(&config)
	// main.go passes its rest config and the manager's client; the default (no-op)
	// scheduler factory ignores both, and using the client here would build it before
	// NewReconciler registers its field index.
	schedulerManager, err := batchscheduler.NewSchedulerManager(ctx, config, nil, nil)
	if err != nil {
		fatalf("creating KubeRay's batch scheduler manager: %v", err)
	}
	schedulerManager.AddToScheme(scheme)
	options := ray.RayClusterReconcilerOptions{
		HeadSidecarContainers:   config.HeadSidecarContainers,
		WorkerSidecarContainers: config.WorkerSidecarContainers,
		// main.go asks the API server (utils.GetClusterType) whether route.openshift.io
		// exists; there is no API server here, so: plain Kubernetes.
		IsOpenShift:              false,
		RayClusterMetricsManager: nil, // config.EnableMetrics defaults to false
		BatchSchedulerManager:    schedulerManager,
		DefaultContainerEnvs:     config.DefaultContainerEnvs,
	}
	reconciler := ray.NewReconciler(ctx, mgr, options)
	c := mgr.GetClient()

	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: cluster.Namespace, Name: cluster.Name}}
	// The logger KubeRay's SetupWithManager gives each reconcile (LogConstructor).
	rctx := ctrl.LoggerInto(ctx, ctrl.Log.WithName("controllers").WithName("RayCluster").WithValues("RayCluster", req.NamespacedName))

	var lastErr error
	settled := false
	var invalid []string
	for call := 1; call <= maxReconcileCalls; call++ {
		before, err := objectNames(ctx, c, cluster.Namespace)
		if err != nil {
			fatalf("listing objects: %v", err)
		}
		_, lastErr = reconciler.Reconcile(rctx, req)
		if lastErr != nil {
			fmt.Fprintf(os.Stderr, "kuberay-pods: reconcile call %d returned an error: %v\n", call, lastErr)
		}
		invalid = append(invalid, drainEvents(recorder)...)
		after, err := objectNames(ctx, c, cluster.Namespace)
		if err != nil {
			fatalf("listing objects: %v", err)
		}
		created, deleted := diffNames(before, after)
		fmt.Fprintf(os.Stderr, "kuberay-pods: reconcile call %d: created %v, deleted %v\n", call, created, deleted)
		if len(invalid) > 0 {
			break
		}
		// Act as the kubelet (and the API server): every pod starts, becomes Ready and
		// gets an IP; Services get a ClusterIP unless headless.
		if err := settle(ctx, c, cluster.Namespace, ips); err != nil {
			fatalf("marking pods running: %v", err)
		}
		if lastErr == nil && len(created) == 0 && len(deleted) == 0 {
			settled = true
			break
		}
	}
	if len(invalid) > 0 {
		fatalf("KubeRay rejected the RayCluster in %s: %s", *clusterFile, strings.Join(invalid, "; "))
	}
	if lastErr != nil {
		fatalf("reconcile still fails after %d calls: %v", maxReconcileCalls, lastErr)
	}
	if !settled {
		fmt.Fprintf(os.Stderr, "kuberay-pods: warning: the reconciler still created or deleted objects after %d calls\n", maxReconcileCalls)
	}

	if err := printObjects(ctx, c, cluster.Namespace); err != nil {
		fatalf("%v", err)
	}
}

// setupLogger sends controller-runtime's (and so KubeRay's) log to stderr; errors only
// unless KUBERAY_PODS_LOG=info|debug.
func setupLogger() {
	opts := zap.Options{DestWriter: os.Stderr, StacktraceLevel: zapcore.PanicLevel}
	switch strings.ToLower(os.Getenv("KUBERAY_PODS_LOG")) {
	case "debug":
		opts.Development = true
	case "info":
	default:
		opts.Level = zapcore.ErrorLevel
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

func loadRayCluster(path string) (*rayv1.RayCluster, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read the RayCluster manifest: %w", err)
	}
	var docs [][]byte
	for _, d := range docSeparator.Split(string(data), -1) {
		if strings.TrimSpace(stripComments(d)) != "" {
			docs = append(docs, []byte(d))
		}
	}
	switch {
	case len(docs) == 0:
		return nil, fmt.Errorf("%s is empty: expected one ray.io/v1 RayCluster", path)
	case len(docs) > 1:
		return nil, fmt.Errorf("%s holds %d YAML documents: expected exactly one ray.io/v1 RayCluster", path, len(docs))
	}
	doc := docs[0]

	asJSON, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return nil, fmt.Errorf("%s is not valid YAML: %w", path, err)
	}
	var generic map[string]any
	if err := json.Unmarshal(asJSON, &generic); err != nil || generic == nil {
		return nil, fmt.Errorf("%s is YAML but not a mapping: expected one ray.io/v1 RayCluster", path)
	}
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, fmt.Errorf("%s: cannot read apiVersion/kind: %w", path, err)
	}
	if tm.APIVersion != rayv1.GroupVersion.String() || tm.Kind != "RayCluster" {
		return nil, fmt.Errorf("%s is not a ray.io/v1 RayCluster (apiVersion %q, kind %q)", path, tm.APIVersion, tm.Kind)
	}
	cluster := &rayv1.RayCluster{}
	if err := yaml.Unmarshal(doc, cluster); err != nil {
		return nil, fmt.Errorf("%s is not a valid RayCluster: %w", path, err)
	}
	// The API server would prune fields the CRD does not know; say so.
	if err := yaml.UnmarshalStrict(doc, &rayv1.RayCluster{}); err != nil {
		fmt.Fprintf(os.Stderr, "kuberay-pods: warning: %s: %v\n", path, err)
	}
	if cluster.Name == "" {
		return nil, fmt.Errorf("%s: the RayCluster has no metadata.name", path)
	}
	applyCRDDefaults(cluster)
	return cluster, nil
}

// applyCRDDefaults applies the defaults of KubeRay v1.5.0's RayCluster CRD schema
// (config/crd/bases/ray.io_rayclusters.yaml, from the +kubebuilder:default markers in
// apis/ray/v1/raycluster_types.go) that the API server would apply on create and the
// fake client does not. Without numOfHosts=1 a worker group wants 0 pods, and without
// minReplicas/maxReplicas the reconciler dereferences nil. (The schema's other
// defaults are on embedded core types, e.g. headService port protocol TCP.)
func applyCRDDefaults(cluster *rayv1.RayCluster) {
	for i := range cluster.Spec.WorkerGroupSpecs {
		g := &cluster.Spec.WorkerGroupSpecs[i]
		if g.Replicas == nil {
			g.Replicas = ptrTo[int32](0)
		}
		if g.MinReplicas == nil {
			g.MinReplicas = ptrTo[int32](0)
		}
		if g.MaxReplicas == nil {
			g.MaxReplicas = ptrTo[int32](2147483647)
		}
		if g.NumOfHosts == 0 {
			g.NumOfHosts = 1
		}
	}
	if svc := cluster.Spec.HeadGroupSpec.HeadService; svc != nil {
		for i := range svc.Spec.Ports {
			if svc.Spec.Ports[i].Protocol == "" {
				svc.Spec.Ports[i].Protocol = corev1.ProtocolTCP
			}
		}
	}
}

func stripComments(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func loadPods(path, namespace string) ([]corev1.Pod, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read --existing pods: %w", err)
	}
	var pods []corev1.Pod
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&pods); err != nil {
		return nil, fmt.Errorf("%s is not a JSON array of Pods: %w", path, err)
	}
	seen := map[string]bool{}
	for i := range pods {
		p := &pods[i]
		if p.Kind != "" && p.Kind != "Pod" {
			return nil, fmt.Errorf("%s: item %d has kind %q, not Pod", path, i, p.Kind)
		}
		if p.Name == "" {
			return nil, fmt.Errorf("%s: item %d has no metadata.name", path, i)
		}
		if p.Namespace == "" {
			p.Namespace = namespace
		}
		key := p.Namespace + "/" + p.Name
		if seen[key] {
			return nil, fmt.Errorf("%s: pod %s appears twice", path, key)
		}
		seen[key] = true
		// Let the fake tracker assign resource versions; drop what the API server owns.
		p.ResourceVersion = ""
		p.ManagedFields = nil
		p.DeletionTimestamp = nil
		p.DeletionGracePeriodSeconds = nil
	}
	return pods, nil
}

// ipAllocator hands out 10.0.x.y pod IPs and 10.96.x.y service IPs not yet in use.
type ipAllocator struct {
	used map[string]bool
	next map[string]int
}

func newIPAllocator() *ipAllocator {
	return &ipAllocator{used: map[string]bool{}, next: map[string]int{}}
}

func (a *ipAllocator) reserve(ip string) {
	if ip != "" {
		a.used[ip] = true
	}
}

func (a *ipAllocator) alloc(prefix string) string {
	base := net.ParseIP(prefix + ".0.0").To4()
	for {
		a.next[prefix]++
		n := a.next[prefix]
		if n%256 == 0 || n%256 == 255 {
			continue
		}
		ip := net.IPv4(base[0], base[1], byte(n/256), byte(n%256)).String()
		if !a.used[ip] {
			a.used[ip] = true
			return ip
		}
	}
}

// markRunning makes a pod look as the kubelet reports a started, ready pod. Returns
// whether it changed anything.
func markRunning(p *corev1.Pod, ips *ipAllocator) bool {
	changed := false
	if p.Status.Phase != corev1.PodRunning {
		p.Status.Phase = corev1.PodRunning
		changed = true
	}
	if p.Status.PodIP == "" {
		p.Status.PodIP = ips.alloc("10.0")
		changed = true
	} else {
		ips.reserve(p.Status.PodIP)
	}
	if len(p.Status.PodIPs) == 0 {
		p.Status.PodIPs = []corev1.PodIP{{IP: p.Status.PodIP}}
		changed = true
	}
	now := metav1.Now()
	if p.Status.StartTime == nil {
		p.Status.StartTime = &now
		changed = true
	}
	for _, t := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		found := false
		for i := range p.Status.Conditions {
			if p.Status.Conditions[i].Type == t {
				found = true
				if p.Status.Conditions[i].Status != corev1.ConditionTrue {
					p.Status.Conditions[i].Status = corev1.ConditionTrue
					p.Status.Conditions[i].LastTransitionTime = now
					changed = true
				}
			}
		}
		if !found {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
			changed = true
		}
	}
	if len(p.Status.ContainerStatuses) == 0 {
		for _, ctr := range p.Spec.Containers {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: ctr.Name, Image: ctr.Image, Ready: true, Started: ptrTo(true),
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
			})
		}
		changed = true
	}
	if len(p.Status.InitContainerStatuses) == 0 && len(p.Spec.InitContainers) > 0 {
		for _, ctr := range p.Spec.InitContainers {
			p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, corev1.ContainerStatus{
				Name: ctr.Name, Image: ctr.Image, Ready: true, Started: ptrTo(false),
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now}},
			})
		}
		changed = true
	}
	return changed
}

func ptrTo[T any](v T) *T { return &v }

// settle plays kubelet and API server between reconcile calls.
func settle(ctx context.Context, c client.Client, namespace string, ips *ipAllocator) error {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(namespace)); err != nil {
		return err
	}
	for i := range pods.Items {
		ips.reserve(pods.Items[i].Status.PodIP)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		if markRunning(p, ips) {
			if err := c.Status().Update(ctx, p); err != nil {
				return fmt.Errorf("pod %s: %w", p.Name, err)
			}
		}
	}
	var svcs corev1.ServiceList
	if err := c.List(ctx, &svcs, client.InNamespace(namespace)); err != nil {
		return err
	}
	for i := range svcs.Items {
		ips.reserve(svcs.Items[i].Spec.ClusterIP)
	}
	for i := range svcs.Items {
		s := &svcs.Items[i]
		if s.Spec.ClusterIP == "" && s.Spec.Type != corev1.ServiceTypeExternalName {
			s.Spec.ClusterIP = ips.alloc("10.96")
			s.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
			if err := c.Update(ctx, s); err != nil {
				return fmt.Errorf("service %s: %w", s.Name, err)
			}
		}
	}
	return nil
}

func objectNames(ctx context.Context, c client.Client, namespace string) (map[string]bool, error) {
	names := map[string]bool{}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(namespace)); err != nil {
		return nil, err
	}
	for _, p := range pods.Items {
		names["pod/"+p.Name] = true
	}
	var svcs corev1.ServiceList
	if err := c.List(ctx, &svcs, client.InNamespace(namespace)); err != nil {
		return nil, err
	}
	for _, s := range svcs.Items {
		names["service/"+s.Name] = true
	}
	return names, nil
}

func diffNames(before, after map[string]bool) (created, deleted []string) {
	created, deleted = []string{}, []string{}
	for n := range after {
		if !before[n] {
			created = append(created, n)
		}
	}
	for n := range before {
		if !after[n] {
			deleted = append(deleted, n)
		}
	}
	sort.Strings(created)
	sort.Strings(deleted)
	return created, deleted
}

// drainEvents prints KubeRay's events (the FakeRecorder blocks when its buffer is
// full) and returns those that reject the RayCluster (reasons Invalid*).
func drainEvents(r *record.FakeRecorder) []string {
	var invalid []string
	for {
		select {
		case e := <-r.Events:
			fmt.Fprintf(os.Stderr, "kuberay-pods: event: %s\n", e)
			if f := strings.Fields(e); len(f) >= 2 && f[0] == corev1.EventTypeWarning && strings.HasPrefix(f[1], "Invalid") {
				invalid = append(invalid, e)
			}
		default:
			return invalid
		}
	}
}

func printObjects(ctx context.Context, c client.Client, namespace string) error {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(namespace)); err != nil {
		return err
	}
	var svcs corev1.ServiceList
	if err := c.List(ctx, &svcs, client.InNamespace(namespace)); err != nil {
		return err
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	sort.Slice(svcs.Items, func(i, j int) bool { return svcs.Items[i].Name < svcs.Items[j].Name })
	for i := range pods.Items {
		pods.Items[i].APIVersion, pods.Items[i].Kind = "v1", "Pod"
	}
	for i := range svcs.Items {
		svcs.Items[i].APIVersion, svcs.Items[i].Kind = "v1", "Service"
	}
	out := struct {
		Pods     []corev1.Pod     `json:"pods"`
		Services []corev1.Service `json:"services"`
	}{Pods: pods.Items, Services: svcs.Items}
	if out.Pods == nil {
		out.Pods = []corev1.Pod{}
	}
	if out.Services == nil {
		out.Services = []corev1.Service{}
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return fmt.Errorf("writing JSON: %w", err)
	}
	return nil
}
