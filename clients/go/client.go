// Package sidecar is the Go client of context-sidecar: a connection to the sidecar's gRPC API
// (the generated client of package contextsidecarv1, embedded), with the bearer token sent on
// every call, a default deadline for calls whose context has none, and errors decoded into
// their reason and bad fields.
//
//	c, err := sidecar.Dial("127.0.0.1:50051", sidecar.WithToken(token))
//	...
//	turn, err := c.AssembleContext(ctx, &pb.AssembleContextRequest{RunId: "run-1", Iteration: 2})
//	if e, ok := sidecar.AsError(err); ok && e.Reason == "validation_error" { ... e.Fields ... }
package sidecar

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pb "github.com/context-sidecar/context-sidecar/clients/go/contextsidecarv1"
)

// DefaultTimeout is the deadline a unary call gets when its context has none (WithTimeout
// changes it). A sidecar call takes milliseconds; a call still waiting after this is stuck.
const DefaultTimeout = 30 * time.Second

// Client is a connection to one sidecar. Every RPC of the ContextSidecar service is a method
// (the embedded generated client); Health is the standard gRPC health service.
type Client struct {
	pb.ContextSidecarClient
	Health healthpb.HealthClient
	conn   *grpc.ClientConn
}

// Option configures Dial.
type Option func(*options)

type options struct {
	token   string
	timeout time.Duration
	tls     *TLSFiles
	dial    []grpc.DialOption
}

// WithToken sends "authorization: Bearer <token>" with every call: the token names the tenant
// when the sidecar has tenants configured.
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithTimeout sets the deadline of unary calls whose context has none; 0 leaves them without one.
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// TLSFiles are the PEM files of a TLS connection to a sidecar that serves [server.tls].
type TLSFiles struct {
	// CAFile holds the CA certificate(s) the sidecar's certificate must be signed by.
	CAFile string
	// CertFile is the client's certificate chain, for a sidecar that requires one (mTLS), and
	// KeyFile its private key: both or neither.
	CertFile string
	KeyFile  string
}

// WithTLS connects over TLS, trusting files.CAFile and, with files.CertFile, presenting that
// client certificate (mTLS). The sidecar's certificate must name the target's host. Dial reads
// the files, and returns the error when one cannot be read or used.
func WithTLS(files TLSFiles) Option { return func(o *options) { o.tls = &files } }

// credentials reads the files into TLS transport credentials.
func (f TLSFiles) credentials() (credentials.TransportCredentials, error) {
	if (f.CertFile == "") != (f.KeyFile == "") {
		return nil, errors.New("context-sidecar: TLSFiles.CertFile and KeyFile go together: give both (mTLS) or neither")
	}
	ca, err := os.ReadFile(f.CAFile)
	if err != nil {
		return nil, fmt.Errorf("context-sidecar: TLSFiles.CAFile: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("context-sidecar: TLSFiles.CAFile: %s holds no PEM certificate", f.CAFile)
	}
	config := &tls.Config{RootCAs: roots}
	if f.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("context-sidecar: TLSFiles.CertFile / KeyFile: %s and %s are not a PEM "+
				"certificate chain and its private key: %w", f.CertFile, f.KeyFile, err)
		}
		config.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(config), nil
}

// WithDialOptions adds gRPC dial options, after the client's own (so that, for instance,
// grpc.WithTransportCredentials replaces the default plaintext transport).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dial = append(o.dial, opts...) }
}

// Dial returns a client of the sidecar at target ("host:port" or "unix:///path"). Like
// grpc.NewClient it does not connect yet: the first call does. The transport is plaintext, as
// the sidecar serves it by default (loopback or a Unix socket), or TLS with WithTLS.
func Dial(target string, opts ...Option) (*Client, error) {
	o := options{timeout: DefaultTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	transport := insecure.NewCredentials()
	if o.tls != nil {
		var err error
		if transport, err = o.tls.credentials(); err != nil {
			return nil, err
		}
	}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(transport),
		grpc.WithChainUnaryInterceptor(unaryInterceptor(o.timeout)),
		grpc.WithChainStreamInterceptor(streamInterceptor),
	}
	if o.token != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(bearer(o.token)))
	}
	conn, err := grpc.NewClient(target, append(dial, o.dial...)...)
	if err != nil {
		return nil, err
	}
	return &Client{ContextSidecarClient: pb.NewContextSidecarClient(conn), Health: healthpb.NewHealthClient(conn),
		conn: conn}, nil
}

// Conn is the underlying connection, for other services or grpc-level settings.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Close closes the connection; calls in flight fail with codes.Canceled.
func (c *Client) Close() error { return c.conn.Close() }

// bearer is the token as per-RPC credentials.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is false because the sidecar serves plaintext on loopback or a Unix
// socket unless [server.tls] is set, and grpc-go refuses to send per-RPC credentials over a
// plaintext connection unless they say they do not need a secure one. Over TLS it is sent too.
func (bearer) RequireTransportSecurity() bool { return false }

func unaryInterceptor(timeout time.Duration) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if _, ok := ctx.Deadline(); !ok && timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		return decode(invoker(ctx, method, req, reply, cc, opts...))
	}
}

// streamInterceptor decodes a stream's errors like a unary call's. A stream (WatchEvents) has
// no default deadline: it lasts until its context is canceled.
func streamInterceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
	streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, decode(err)
	}
	return decodingStream{s}, nil
}

type decodingStream struct{ grpc.ClientStream }

func (s decodingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == io.EOF {
		return err
	}
	return decode(err)
}

// Error is a failed call's status, decoded: the gRPC code and message, and from the status
// details the google.rpc.ErrorInfo (Reason, a stable machine code such as "validation_error";
// Domain "context-sidecar"; Metadata) and the google.rpc.BadRequest's field violations.
type Error struct {
	Code     codes.Code
	Message  string
	Reason   string
	Domain   string
	Metadata map[string]string
	Fields   []FieldViolation
	status   *status.Status
}

// FieldViolation names a request field ("append_events[2].iteration") and what is wrong with it.
type FieldViolation struct {
	Field       string
	Description string
}

func (e *Error) Error() string {
	if e.Reason == "" {
		return fmt.Sprintf("context-sidecar: %s: %s", e.Code, e.Message)
	}
	return fmt.Sprintf("context-sidecar: %s (%s): %s", e.Code, e.Reason, e.Message)
}

// GRPCStatus keeps status.Code and status.FromError working on a decoded error.
func (e *Error) GRPCStatus() *status.Status { return e.status }

// HasField reports whether a field violation names field.
func (e *Error) HasField(field string) bool {
	for _, f := range e.Fields {
		if f.Field == field {
			return true
		}
	}
	return false
}

// AsError returns err as an *Error: the error of a call through this package's Client (found
// with errors.As), or any other gRPC status error, decoded. False for nil and errors that carry
// no status.
func AsError(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	s, ok := status.FromError(err)
	if !ok || s.Code() == codes.OK {
		return nil, false
	}
	return fromStatus(s), true
}

func decode(err error) error {
	if s, ok := status.FromError(err); ok && err != nil {
		return fromStatus(s)
	}
	return err
}

func fromStatus(s *status.Status) *Error {
	e := &Error{Code: s.Code(), Message: s.Message(), status: s}
	for _, detail := range s.Details() {
		switch d := detail.(type) {
		case *errdetails.ErrorInfo:
			e.Reason, e.Domain, e.Metadata = d.GetReason(), d.GetDomain(), d.GetMetadata()
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				e.Fields = append(e.Fields, FieldViolation{Field: v.GetField(), Description: v.GetDescription()})
			}
		}
	}
	return e
}
