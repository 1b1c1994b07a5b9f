package main

import (
	"context"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// fakeManager is the smallest manager.Manager that KubeRay's ray.NewReconciler
// (ray-operator v1.5.0, controllers/ray/raycluster_controller.go) accepts. NewReconciler
// only calls GetFieldIndexer().IndexField, GetClient, GetScheme and GetEventRecorderFor;
// every other method comes from the embedded nil interface and would panic if called,
// which would show that a newer KubeRay needs more of the manager.
//
// The client is built lazily from a fake.ClientBuilder so that the field index KubeRay
// registers in NewReconciler ("metadata.uid" on Pods) lands in the fake client, as it
// lands in the manager's cache in the real operator.
type fakeManager struct {
	manager.Manager

	scheme   *runtime.Scheme
	builder  *fake.ClientBuilder
	client   client.Client
	recorder record.EventRecorder
}

func (m *fakeManager) GetScheme() *runtime.Scheme { return m.scheme }

func (m *fakeManager) GetClient() client.Client {
	if m.client == nil {
		m.client = m.builder.Build()
	}
	return m.client
}

func (m *fakeManager) GetEventRecorderFor(string) record.EventRecorder { return m.recorder }

func (m *fakeManager) GetFieldIndexer() client.FieldIndexer { return builderIndexer{m} }

type builderIndexer struct{ m *fakeManager }

func (b builderIndexer) IndexField(_ context.Context, obj client.Object, field string, extract client.IndexerFunc) error {
	if b.m.client != nil {
		// Only reachable if KubeRay starts using the client before registering its index.
		panic("fakeManager: IndexField(" + field + ") called after the fake client was built")
	}
	b.m.builder.WithIndex(obj, field, extract)
	return nil
}
