// Package verify checks deploy/ with the upstream tools' own types and
// parsers: every Kubernetes manifest decodes strictly into k8s.io/api,
// KEDA's v1alpha1 and prometheus-operator's monitoring/v1 types, the
// manifests agree with each other and with the worker, and the NATS
// configuration of the Kubernetes path parses with nats-server's parser.
// It is a module of its own so the product does not depend on them.
package verify
