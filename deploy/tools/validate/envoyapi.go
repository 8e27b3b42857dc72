package validate

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"

	// Every Envoy type the shipped files use, registered so that protojson resolves
	// each "@type". A type that is not registered here is refused: add it when a file
	// starts using a new extension.
	_ "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	_ "google.golang.org/protobuf/types/known/wrapperspb"
)

// strictJSON refuses unknown fields and resolves every Any through the registered
// types (an unknown "@type" is an error).
var strictJSON = protojson.UnmarshalOptions{DiscardUnknown: false, Resolver: protoregistry.GlobalTypes}

// validatable is implemented by every go-control-plane message (protoc-gen-validate).
type validatable interface{ ValidateAll() error }

// UnmarshalEnvoy decodes JSON into an Envoy message strictly and validates it: the
// message itself with ValidateAll, and every Any inside it (at any depth), unpacked and
// validated in turn (ValidateAll does not look inside Any). partialLevels says how many
// levels, counted in Any boundaries from the top, hold partial objects that are merged
// into existing configuration (an Istio MERGE patch: 1 for the value itself, 2 when its
// typed_config is merged too); those are checked for unknown fields and types but not
// for required fields.
func UnmarshalEnvoy(js []byte, m proto.Message, partialLevels int) error {
	if err := strictJSON.Unmarshal(js, m); err != nil {
		return err
	}
	if partialLevels == 0 {
		if v, ok := m.(validatable); ok {
			if err := v.ValidateAll(); err != nil {
				return err
			}
		}
	}
	w := anyWalker{partialLevels: partialLevels}
	return w.walk(m.ProtoReflect(), string(m.ProtoReflect().Descriptor().Name()), 0)
}

type anyWalker struct{ partialLevels int }

// walk visits every Any below m, unpacks it with the registered types and validates
// the unpacked message. level is the number of Any boundaries above m.
func (w anyWalker) walk(m protoreflect.Message, path string, level int) error {
	var errs []error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := path + "." + fd.JSONName()
		switch {
		case fd.IsList():
			if fd.Message() == nil {
				return true
			}
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				errs = append(errs, w.visit(l.Get(i).Message(), fmt.Sprintf("%s[%d]", p, i), level))
			}
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				return true
			}
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				errs = append(errs, w.visit(mv.Message(), fmt.Sprintf("%s[%s]", p, k.String()), level))
				return true
			})
		case fd.Message() != nil:
			errs = append(errs, w.visit(v.Message(), p, level))
		}
		return true
	})
	return errors.Join(errs...)
}

func (w anyWalker) visit(m protoreflect.Message, path string, level int) error {
	a, ok := m.Interface().(*anypb.Any)
	if !ok {
		return w.walk(m, path, level)
	}
	inner, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{Resolver: protoregistry.GlobalTypes})
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if level+1 >= w.partialLevels {
		if v, ok := inner.(validatable); ok {
			if err := v.ValidateAll(); err != nil {
				return fmt.Errorf("%s (%s): %w", path, a.TypeUrl, err)
			}
		}
	}
	return w.walk(inner.ProtoReflect(), path+"<"+string(inner.ProtoReflect().Descriptor().Name())+">", level+1)
}

// unpack returns the message inside an Any (already known to resolve).
func unpack(a *anypb.Any) proto.Message {
	if a == nil {
		return nil
	}
	m, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{Resolver: protoregistry.GlobalTypes})
	if err != nil {
		return nil
	}
	return m
}
