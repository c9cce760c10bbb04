# ironlb: a MetalLB-compatible Layer-2 LoadBalancer for bare-metal Kubernetes.
# Run `make help` for the targets. Tools are built into ./bin, pinned below.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

## Versions (one Kubernetes minor for client libraries and test binaries).
KUBE_VERSION ?= v1.37.1
CONTROLLER_TOOLS_VERSION ?= v0.23.0
HELM_VERSION ?= v3.22.0
GOLANGCI_LINT_VERSION ?= v2.15.0

LOCALBIN ?= $(CURDIR)/bin
export PATH := $(LOCALBIN):$(PATH)
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen
HELM ?= $(LOCALBIN)/helm
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint
KUBE_BINARIES := etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl
# envtest (controller-runtime) finds etcd and kube-apiserver here.
export KUBEBUILDER_ASSETS ?= $(LOCALBIN)

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Display this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate DeepCopy methods for the API types.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate CRDs, RBAC and webhook manifests from the Go markers.
	$(CONTROLLER_GEN) crd paths="./api/..." output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) webhook paths="./internal/webhook/..." output:webhook:artifacts:config=config/webhook

.PHONY: verify-gen
verify-gen: generate manifests ## Fail when generated files differ from what is committed.
	@if [ -n "$$(git status --porcelain -- api config charts)" ]; then \
		echo "Generated files are out of date. Run 'make generate manifests' and commit:"; \
		git status --porcelain -- api config charts; git --no-pager diff --stat -- api config charts; exit 1; fi

.PHONY: fmt
fmt: ## Run gofmt on the code.
	gofmt -l -w $$(git ls-files '*.go')

.PHONY: vet
vet: ## Run go vet.
	go vet ./...

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint.
	$(GOLANGCI_LINT) run ./...

##@ Test

.PHONY: test
test: tools verify-gen vet test-unit ## Run every test: unit, fuzz seeds, envtest integration (the README's test command).

.PHONY: test-unit
test-unit: ## Run the Go tests (envtest suites use the API server in ./bin).
	go test ./... -count=1

##@ Build

.PHONY: build
build: ## Build the ironlb binary into ./bin.
	go build -o $(LOCALBIN)/ironlb ./cmd/ironlb

##@ Tools

.PHONY: tools
tools: $(CONTROLLER_GEN) $(HELM) $(GOLANGCI_LINT) $(addprefix $(LOCALBIN)/,$(KUBE_BINARIES)) ## Build every pinned tool into ./bin (idempotent).

$(LOCALBIN):
	mkdir -p $(LOCALBIN)

# The Kubernetes binaries are built from k8s.io/kubernetes at KUBE_VERSION (hack/tools/go.mod);
# a stamp file records the version so a bump rebuilds them. Cold build: ~10-15 min on 2 cores.
KUBE_STAMP := $(LOCALBIN)/.kube-$(KUBE_VERSION)
$(addprefix $(LOCALBIN)/,$(KUBE_BINARIES)): $(KUBE_STAMP)
$(KUBE_STAMP): hack/tools/go.mod hack/tools/go.sum | $(LOCALBIN)
	@echo ">> building Kubernetes $(KUBE_VERSION) binaries into $(LOCALBIN) (cold: ~10-15 min on 2 cores)"
	cd hack/tools && go build -ldflags "-s -w \
		-X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
		-X k8s.io/component-base/version.gitMajor=1 \
		-X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(KUBE_VERSION))) \
		-X k8s.io/component-base/version.gitTreeState=clean" \
		-o $(LOCALBIN)/ ./etcd $(addprefix k8s.io/kubernetes/cmd/,$(filter-out etcd,$(KUBE_BINARIES)))
	touch $@

# go-install-tool installs a Go module at a pinned version into ./bin, named tool-version,
# with a plain-named link, so a version bump reinstalls it.
define go-install-tool
@[ -f "$(1)-$(3)" ] || { echo ">> installing $(2)@$(3)"; rm -f $(1); GOBIN=$(LOCALBIN) go install $(2)@$(3); mv $(1) $(1)-$(3); }
@ln -sf $$(basename $(1))-$(3) $(1)
endef

# `make bin/controller-gen` works too (the rules above use absolute paths).
.PHONY: bin/controller-gen
bin/controller-gen: $(CONTROLLER_GEN)
$(CONTROLLER_GEN): | $(LOCALBIN)
	$(call go-install-tool,$(CONTROLLER_GEN),sigs.k8s.io/controller-tools/cmd/controller-gen,$(CONTROLLER_TOOLS_VERSION))
$(HELM): | $(LOCALBIN)
	$(call go-install-tool,$(HELM),helm.sh/helm/v3/cmd/helm,$(HELM_VERSION))
$(GOLANGCI_LINT): | $(LOCALBIN)
	$(call go-install-tool,$(GOLANGCI_LINT),github.com/golangci/golangci-lint/v2/cmd/golangci-lint,$(GOLANGCI_LINT_VERSION))
