module gpu-lab/prometheus-operator

go 1.26.0

// Not built: the lab reads the Prometheus Operator's CRDs (example/prometheus-operator-crd/) from this module's
// source, fetched through the Go module proxy and checked against go.sum (lab/gobuild.py module_source).
require github.com/prometheus-operator/prometheus-operator v0.94.0
