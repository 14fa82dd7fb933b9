package dev.contextsidecar.client;

import dev.contextsidecar.v1.ContextSidecarGrpc;
import dev.contextsidecar.v1.ContextSidecarGrpc.ContextSidecarBlockingStub;
import dev.contextsidecar.v1.ContextSidecarGrpc.ContextSidecarFutureStub;
import dev.contextsidecar.v1.ContextSidecarGrpc.ContextSidecarStub;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ChannelCredentials;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ClientInterceptors;
import io.grpc.ForwardingClientCall.SimpleForwardingClientCall;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.StatusRuntimeException;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.netty.shaded.io.netty.channel.ChannelOption;
import java.time.Duration;
import java.util.Objects;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;

/**
 * A connection to a context sidecar ({@code contextsidecar.v1.ContextSidecar}).
 *
 * <p>Every call made through it carries the tenant's bearer token (when one is given) and, for
 * unary calls, a deadline ({@link Builder#deadline}, 30 s by default) unless the caller set one
 * on the stub with {@code withDeadlineAfter}. Server-streaming calls ({@code WatchEvents}) get no
 * default deadline: a watch runs until the caller cancels it.
 *
 * <pre>{@code
 * try (SidecarClient client = SidecarClient.builder("127.0.0.1:50051").token(token).build()) {
 *   AssembleContextResponse turn = client.call(s -> s.assembleContext(request));
 * }
 * }</pre>
 *
 * <p>{@link #call} turns a failed call into a {@link SidecarException} (code, reason, fields);
 * the stubs themselves ({@link #blocking()}, {@link #future()}, {@link #async()}) throw or
 * report grpc-java's own exceptions, which {@link SidecarException#from} decodes.
 */
public final class SidecarClient implements AutoCloseable {
  private static final Metadata.Key<String> AUTHORIZATION =
      Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);

  private final ManagedChannel managed;
  private final Channel channel;
  private final ContextSidecarBlockingStub blocking;
  private final ContextSidecarFutureStub future;
  private final ContextSidecarStub async;

  private SidecarClient(ManagedChannel managed, String token, Duration deadline) {
    this.managed = managed;
    this.channel =
        ClientInterceptors.intercept(managed, new DefaultDeadline(deadline), new BearerToken(token));
    this.blocking = ContextSidecarGrpc.newBlockingStub(channel);
    this.future = ContextSidecarGrpc.newFutureStub(channel);
    this.async = ContextSidecarGrpc.newStub(channel);
  }

  public static Builder builder() {
    return new Builder();
  }

  /** {@code builder().target(target)}. */
  public static Builder builder(String target) {
    return new Builder().target(target);
  }

  /** The blocking stub; failures throw {@link StatusRuntimeException}. */
  public ContextSidecarBlockingStub blocking() {
    return blocking;
  }

  /** The future stub; a failed future's cause is a {@link StatusRuntimeException}. */
  public ContextSidecarFutureStub future() {
    return future;
  }

  /** The callback stub, for {@code WatchEvents}. */
  public ContextSidecarStub async() {
    return async;
  }

  /** The channel with the token and deadline applied, for other services (gRPC health). */
  public Channel channel() {
    return channel;
  }

  /**
   * Runs {@code rpc} on the blocking stub: {@code client.call(s -> s.openRun(request))}.
   *
   * @throws SidecarException when the sidecar answers with an error status
   */
  public <R> R call(Function<ContextSidecarBlockingStub, R> rpc) {
    try {
      return rpc.apply(blocking);
    } catch (StatusRuntimeException e) {
      throw SidecarException.from(e);
    }
  }

  /** Closes the channel, letting calls in flight finish for up to 5 seconds. */
  @Override
  public void close() {
    managed.shutdown();
    try {
      if (!managed.awaitTermination(5, TimeUnit.SECONDS)) {
        managed.shutdownNow();
      }
    } catch (InterruptedException e) {
      managed.shutdownNow();
      Thread.currentThread().interrupt();
    }
  }

  public static final class Builder {
    private String target;
    private String token;
    private TlsFiles tls;
    private Duration deadline = Duration.ofSeconds(30);

    private Builder() {}

    /**
     * Where the sidecar listens: {@code "127.0.0.1:50051"} or {@code "unix:///abs/path.sock"}.
     * The channel is plaintext, as the sidecar serves by default (loopback or a unix socket),
     * unless {@link #tls} is given.
     */
    public Builder target(String target) {
      this.target = Objects.requireNonNull(target, "target");
      return this;
    }

    /**
     * The tenant's bearer token, for a sidecar configured with tenants: every call then carries
     * {@code authorization: Bearer <token>}. Without one no such metadata is sent.
     */
    public Builder token(String token) {
      if (token != null && token.isEmpty()) {
        throw new IllegalArgumentException("token must not be empty");
      }
      this.token = token;
      return this;
    }

    /**
     * TLS to a sidecar serving {@code [server.tls]}: trusting {@link TlsFiles#caFile()}, and
     * presenting the client certificate under mTLS. The sidecar's certificate must name the
     * target's host. {@link #build} reads the files. null: plaintext.
     */
    public Builder tls(TlsFiles tls) {
      this.tls = tls;
      return this;
    }

    /** The deadline of each unary call that sets none itself. */
    public Builder deadline(Duration deadline) {
      if (deadline.isNegative() || deadline.isZero()) {
        throw new IllegalArgumentException("deadline must be positive: " + deadline);
      }
      this.deadline = deadline;
      return this;
    }

    /**
     * The client; its channel connects at the first call.
     *
     * @throws IllegalArgumentException when a {@link #tls} file cannot be read or used (named)
     */
    public SidecarClient build() {
      Objects.requireNonNull(target, "target");
      ChannelCredentials credentials = tls == null ? InsecureChannelCredentials.create() : tls.credentials();
      // Grpc.newChannelBuilder, not ManagedChannelBuilder.forTarget: it picks the transport by
      // the target's address type, so "unix://" gets netty's domain-socket channel.
      ManagedChannelBuilder<?> channel = Grpc.newChannelBuilder(target, credentials);
      if (target.startsWith("unix:") && channel instanceof NettyChannelBuilder netty) {
        // grpc sets TCP keepalive on every netty channel; a unix socket has none, and netty
        // would log a warning for each connection (grpc-java issue 10408). null unsets it.
        netty.withOption(ChannelOption.SO_KEEPALIVE, null);
      }
      return new SidecarClient(channel.build(), token, deadline);
    }
  }

  // An interceptor rather than CallCredentials: the token is one fixed header naming a tenant,
  // sent over TLS and over the plaintext loopback channel the sidecar offers by default, where
  // the auth library's token credentials refuse to send anything (they require a secure channel).
  private static final class BearerToken implements ClientInterceptor {
    private final String value;

    BearerToken(String token) {
      this.value = token == null ? null : "Bearer " + token;
    }

    @Override
    public <Q, R> ClientCall<Q, R> interceptCall(
        MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
      ClientCall<Q, R> call = next.newCall(method, options);
      if (value == null) {
        return call;
      }
      return new SimpleForwardingClientCall<>(call) {
        @Override
        public void start(Listener<R> listener, Metadata headers) {
          headers.put(AUTHORIZATION, value);
          super.start(listener, headers);
        }
      };
    }
  }

  // A deadline is an instant, so it is set per call here: a stub made once with
  // withDeadlineAfter would carry one instant to every later call.
  private static final class DefaultDeadline implements ClientInterceptor {
    private final long nanos;

    DefaultDeadline(Duration deadline) {
      this.nanos = deadline.toNanos();
    }

    @Override
    public <Q, R> ClientCall<Q, R> interceptCall(
        MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
      boolean unary = method.getType() == MethodDescriptor.MethodType.UNARY;
      if (unary && options.getDeadline() == null) {
        options = options.withDeadlineAfter(nanos, TimeUnit.NANOSECONDS);
      }
      return next.newCall(method, options);
    }
  }
}
