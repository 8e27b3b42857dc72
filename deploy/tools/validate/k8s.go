package validate

import (
	"bytes"
	"encoding/json"
	"fmt"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	extensionsv1alpha1 "istio.io/api/extensions/v1alpha1"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/yaml"

	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Object is a validated Kubernetes-style document.
type Object struct {
	Doc
	Meta metav1.ObjectMeta
	// Exactly one of these is set, by kind.
	WasmPlugin      *extensionsv1alpha1.WasmPlugin
	EnvoyFilter     *networkingv1alpha3.EnvoyFilter
	DestinationRule *networkingv1alpha3.DestinationRule
	Service         *corev1.Service
	Gateway         *gatewayv1.Gateway
	HTTPRoute       *gatewayv1.HTTPRoute
	Kustomization   *types.Kustomization
	Other           any
}

// CheckObject validates a Kubernetes-style document strictly against the API of its
// kind: Istio resources with strict protojson on spec (and lowerCamelCase field names
// only, as the API server's schema has them), Kubernetes and Gateway API objects with
// their Go types, unknown fields refused everywhere.
func CheckObject(d Doc) (*Object, error) {
	o := &Object{Doc: d}
	fail := func(err error) (*Object, error) { return nil, fmt.Errorf("%s (%s): %w", d.Source, d.Kind, err) }
	gv := d.Group + "/" + d.Ver
	switch {
	case d.Group == "extensions.istio.io" && d.Kind == "WasmPlugin" && d.Ver == "v1alpha1":
		o.WasmPlugin = &extensionsv1alpha1.WasmPlugin{}
		if err := o.istio(o.WasmPlugin); err != nil {
			return fail(err)
		}
	case d.Group == "networking.istio.io" && d.Kind == "EnvoyFilter" && d.Ver == "v1alpha3":
		o.EnvoyFilter = &networkingv1alpha3.EnvoyFilter{}
		if err := o.istio(o.EnvoyFilter); err != nil {
			return fail(err)
		}
		if err := checkEnvoyFilterPatches(o.EnvoyFilter); err != nil {
			return fail(err)
		}
	case d.Group == "networking.istio.io" && d.Kind == "DestinationRule" && (d.Ver == "v1" || d.Ver == "v1beta1" || d.Ver == "v1alpha3"):
		o.DestinationRule = &networkingv1alpha3.DestinationRule{}
		if err := o.istio(o.DestinationRule); err != nil {
			return fail(err)
		}
	case gv == "/v1" && d.Kind == "Service":
		o.Service = &corev1.Service{}
		if err := strictK8s(d.JSON, o.Service, &o.Meta, &o.Service.ObjectMeta); err != nil {
			return fail(err)
		}
	case gv == "/v1" && d.Kind == "Namespace":
		return o.k8s(&corev1.Namespace{}, func(x any) *metav1.ObjectMeta { return &x.(*corev1.Namespace).ObjectMeta })
	case gv == "/v1" && d.Kind == "ConfigMap":
		return o.k8s(&corev1.ConfigMap{}, func(x any) *metav1.ObjectMeta { return &x.(*corev1.ConfigMap).ObjectMeta })
	case gv == "apps/v1" && d.Kind == "Deployment":
		return o.k8s(&appsv1.Deployment{}, func(x any) *metav1.ObjectMeta { return &x.(*appsv1.Deployment).ObjectMeta })
	case gv == "gateway.networking.k8s.io/v1" && d.Kind == "Gateway":
		o.Gateway = &gatewayv1.Gateway{}
		if err := strictK8s(d.JSON, o.Gateway, &o.Meta, &o.Gateway.ObjectMeta); err != nil {
			return fail(err)
		}
	case gv == "gateway.networking.k8s.io/v1" && d.Kind == "HTTPRoute":
		o.HTTPRoute = &gatewayv1.HTTPRoute{}
		if err := strictK8s(d.JSON, o.HTTPRoute, &o.Meta, &o.HTTPRoute.ObjectMeta); err != nil {
			return fail(err)
		}
	case gv == "kustomize.config.k8s.io/v1beta1" && d.Kind == "Kustomization":
		o.Kustomization = &types.Kustomization{}
		if err := yaml.UnmarshalStrict(d.JSON, o.Kustomization); err != nil {
			return fail(err)
		}
	default:
		return fail(fmt.Errorf("no validator for %s %s: add one to deploy/tools/validate", d.Group+"/"+d.Ver, d.Kind))
	}
	return o, nil
}

func (o *Object) k8s(obj any, meta func(any) *metav1.ObjectMeta) (*Object, error) {
	if err := strictK8s(o.JSON, obj, &o.Meta, meta(obj)); err != nil {
		return nil, fmt.Errorf("%s (%s): %w", o.Source, o.Kind, err)
	}
	o.Other = obj
	return o, nil
}

func strictK8s(js []byte, obj any, dst, meta *metav1.ObjectMeta) error {
	if err := yaml.UnmarshalStrict(js, obj); err != nil {
		return err
	}
	*dst = *meta
	if meta.Name == "" {
		return fmt.Errorf("metadata.name is required")
	}
	return nil
}

// istio decodes an Istio resource: top-level keys apiVersion, kind, metadata, spec;
// metadata as Kubernetes ObjectMeta; spec with strict protojson.
func (o *Object) istio(spec proto.Message) error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(o.JSON, &top); err != nil {
		return err
	}
	for k := range top {
		switch k {
		case "apiVersion", "kind", "metadata", "spec":
		default:
			return fmt.Errorf("unknown top-level field %q", k)
		}
	}
	if err := yaml.UnmarshalStrict(top["metadata"], &o.Meta); err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	if o.Meta.Name == "" {
		return fmt.Errorf("metadata.name is required")
	}
	specJSON, ok := top["spec"]
	if !ok {
		return fmt.Errorf("spec is required")
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(specJSON, spec); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	var generic any
	if err := json.Unmarshal(specJSON, &generic); err != nil {
		return err
	}
	return camelCaseOnly(generic, spec.ProtoReflect().Descriptor(), "spec")
}

// camelCaseOnly refuses proto field names written in snake_case: protojson accepts
// them, the Kubernetes API server (whose CRD schema lists the JSON names) does not.
// Free-form values (Struct, Any, …) are not walked.
func camelCaseOnly(v any, md protoreflect.MessageDescriptor, path string) error {
	if md.FullName().Parent() == "google.protobuf" {
		return nil
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	fields := md.Fields()
	for k, val := range obj {
		fd := fields.ByJSONName(k)
		if fd == nil {
			if alt := fields.ByName(protoreflect.Name(k)); alt != nil {
				return fmt.Errorf("%s.%s: write it %q", path, k, alt.JSONName())
			}
			return fmt.Errorf("%s.%s: unknown field", path, k)
		}
		if fd.Message() == nil {
			continue
		}
		p := path + "." + k
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				if m, ok := val.(map[string]any); ok {
					for mk, mv := range m {
						if err := camelCaseOnly(mv, fd.MapValue().Message(), p+"["+mk+"]"); err != nil {
							return err
						}
					}
				}
			}
		case fd.IsList():
			if l, ok := val.([]any); ok {
				for i, e := range l {
					if err := camelCaseOnly(e, fd.Message(), fmt.Sprintf("%s[%d]", p, i)); err != nil {
						return err
					}
				}
			}
		default:
			if err := camelCaseOnly(val, fd.Message(), p); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkEnvoyFilterPatches validates each patch value against the Envoy type it
// applies to: strict fields and types everywhere, every Any unpacked and validated,
// required fields enforced except in the partial objects of a MERGE.
func checkEnvoyFilterPatches(ef *networkingv1alpha3.EnvoyFilter) error {
	for i, p := range ef.GetConfigPatches() {
		path := fmt.Sprintf("spec.configPatches[%d]", i)
		v := p.GetPatch().GetValue()
		if v == nil {
			if p.GetPatch().GetOperation() != networkingv1alpha3.EnvoyFilter_Patch_REMOVE {
				return fmt.Errorf("%s.patch.value is required", path)
			}
			continue
		}
		js, err := protojson.Marshal(v)
		if err != nil {
			return err
		}
		var m proto.Message
		partial := 0
		merge := p.GetPatch().GetOperation() == networkingv1alpha3.EnvoyFilter_Patch_MERGE
		switch p.GetApplyTo() {
		case networkingv1alpha3.EnvoyFilter_CLUSTER:
			m = &clusterv3.Cluster{}
		case networkingv1alpha3.EnvoyFilter_LISTENER:
			m = &listenerv3.Listener{}
		case networkingv1alpha3.EnvoyFilter_FILTER_CHAIN:
			m = &listenerv3.FilterChain{}
		case networkingv1alpha3.EnvoyFilter_NETWORK_FILTER:
			m = &listenerv3.Filter{}
			if merge {
				partial = 2 // the filter and the typed_config merged into it
			}
		case networkingv1alpha3.EnvoyFilter_HTTP_FILTER:
			m = &hcmv3.HttpFilter{}
			if merge {
				partial = 2
			}
		case networkingv1alpha3.EnvoyFilter_ROUTE_CONFIGURATION:
			m = &routev3.RouteConfiguration{}
		case networkingv1alpha3.EnvoyFilter_VIRTUAL_HOST:
			m = &routev3.VirtualHost{}
		case networkingv1alpha3.EnvoyFilter_HTTP_ROUTE:
			m = &routev3.Route{}
		case networkingv1alpha3.EnvoyFilter_EXTENSION_CONFIG:
			m = &corev3.TypedExtensionConfig{}
		case networkingv1alpha3.EnvoyFilter_BOOTSTRAP:
			m = &bootstrapv3.Bootstrap{}
		default:
			return fmt.Errorf("%s: applyTo %s is not validated: add it to deploy/tools/validate", path, p.GetApplyTo())
		}
		if merge && partial == 0 {
			partial = 1
		}
		if err := UnmarshalEnvoy(js, m, partial); err != nil {
			return fmt.Errorf("%s.patch.value (%s): Envoy API: %w", path, m.ProtoReflect().Descriptor().FullName(), err)
		}
	}
	return nil
}

// envoyPatchValue decodes a patch value already known to be valid.
func envoyPatchValue(p *networkingv1alpha3.EnvoyFilter_EnvoyConfigObjectPatch, m proto.Message) bool {
	js, err := protojson.Marshal(p.GetPatch().GetValue())
	if err != nil {
		return false
	}
	return strictJSON.Unmarshal(js, m) == nil
}

// pluginConfigJSON is the JSON Istio hands the plugin for a WasmPlugin's pluginConfig
// (a protobuf Struct, so every number is a double).
func pluginConfigJSON(wp *extensionsv1alpha1.WasmPlugin) ([]byte, error) {
	if wp.GetPluginConfig() == nil {
		return []byte("{}"), nil
	}
	js, err := protojson.Marshal(wp.GetPluginConfig())
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, js); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
