// Package helm holds the tests of the outboxrelay Helm chart
// (deploy/helm/outboxrelay). It is a module of its own so that the helm
// and Kubernetes modules never become dependencies of the relay.
package helm
