package dev.contextsidecar.client;

import io.grpc.ChannelCredentials;
import io.grpc.TlsChannelCredentials;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.PrivateKey;
import java.security.PublicKey;
import java.security.Signature;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.Base64;
import java.util.Collection;
import java.util.Objects;
import java.util.Optional;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The PEM files of a TLS connection to a sidecar that serves {@code [server.tls]}: the CA that
 * signed the sidecar's certificate, and for a sidecar that requires client certificates (mTLS)
 * the client's certificate chain and its private key (PKCS#8, unencrypted).
 *
 * <pre>{@code
 * SidecarClient.builder("sidecar.internal:50051").tls(TlsFiles.of(Path.of("ca.pem"))).build();
 * SidecarClient.builder(target).tls(TlsFiles.of(ca, Path.of("client.pem"), Path.of("client.key"))).build();
 * }</pre>
 */
public final class TlsFiles {
  private static final Pattern PKCS8 =
      Pattern.compile("-----BEGIN PRIVATE KEY-----([A-Za-z0-9+/=\\s]+)-----END PRIVATE KEY-----");

  private final Path caFile;
  private final Path certFile;
  private final Path keyFile;

  private TlsFiles(Path caFile, Path certFile, Path keyFile) {
    this.caFile = caFile;
    this.certFile = certFile;
    this.keyFile = keyFile;
  }

  /** TLS trusting the CA certificate(s) in {@code caFile}. */
  public static TlsFiles of(Path caFile) {
    return new TlsFiles(Objects.requireNonNull(caFile, "caFile"), null, null);
  }

  /** mTLS: TLS trusting {@code caFile}, presenting the certificate chain in {@code certFile}. */
  public static TlsFiles of(Path caFile, Path certFile, Path keyFile) {
    return new TlsFiles(Objects.requireNonNull(caFile, "caFile"),
        Objects.requireNonNull(certFile, "certFile"), Objects.requireNonNull(keyFile, "keyFile"));
  }

  /** {@link #of(Path)} with a path as a string. */
  public static TlsFiles of(String caFile) {
    return of(Path.of(caFile));
  }

  /** {@link #of(Path, Path, Path)} with paths as strings. */
  public static TlsFiles of(String caFile, String certFile, String keyFile) {
    return of(Path.of(caFile), Path.of(certFile), Path.of(keyFile));
  }

  public Path caFile() {
    return caFile;
  }

  /** The client certificate chain, present for mTLS. */
  public Optional<Path> certFile() {
    return Optional.ofNullable(certFile);
  }

  /** The client certificate's private key, present for mTLS. */
  public Optional<Path> keyFile() {
    return Optional.ofNullable(keyFile);
  }

  /**
   * The channel's credentials, the files read now: grpc would find an unusable file only at
   * the first handshake, and then refuse every call with the same UNAVAILABLE as an unreachable
   * sidecar, so the error here names the file instead.
   *
   * @throws IllegalArgumentException when a file cannot be read or is not what it should be
   */
  ChannelCredentials credentials() {
    byte[] ca = read("caFile", caFile);
    if (certificates("caFile", caFile, ca).isEmpty()) {
      throw new IllegalArgumentException("tls caFile: " + caFile + " holds no PEM certificate");
    }
    TlsChannelCredentials.Builder builder = TlsChannelCredentials.newBuilder();
    try {
      builder.trustManager(new ByteArrayInputStream(ca));
      if (certFile != null) {
        byte[] chain = read("certFile", certFile);
        byte[] key = read("keyFile", keyFile);
        checkPair(chain, key);
        builder.keyManager(new ByteArrayInputStream(chain), new ByteArrayInputStream(key));
      }
    } catch (IOException e) {
      throw new IllegalArgumentException("tls: " + e.getMessage(), e); // streams over bytes: not expected
    }
    return builder.build();
  }

  /** The key must be the certificate's: a signature it makes verifies with the certificate's key. */
  private void checkPair(byte[] chain, byte[] key) {
    Collection<? extends Certificate> certificates = certificates("certFile", certFile, chain);
    if (certificates.isEmpty()) {
      throw new IllegalArgumentException("tls certFile: " + certFile + " holds no PEM certificate");
    }
    PublicKey publicKey = certificates.iterator().next().getPublicKey();
    Matcher pem = PKCS8.matcher(new String(key, StandardCharsets.US_ASCII));
    String mismatch = "tls certFile / keyFile: " + certFile + " and " + keyFile
        + " are not a PEM certificate chain and its private key";
    if (!pem.find()) {
      throw new IllegalArgumentException(mismatch + " (the key file holds no PKCS#8 \"PRIVATE KEY\")");
    }
    boolean matches;
    try {
      PrivateKey privateKey = KeyFactory.getInstance(publicKey.getAlgorithm())
          .generatePrivate(new PKCS8EncodedKeySpec(Base64.getMimeDecoder().decode(pem.group(1))));
      String algorithm = switch (publicKey.getAlgorithm()) {
        case "EC" -> "SHA256withECDSA";
        case "RSA" -> "SHA256withRSA";
        default -> publicKey.getAlgorithm(); // Ed25519, Ed448: the key's own algorithm signs
      };
      byte[] probe = "context-sidecar".getBytes(StandardCharsets.US_ASCII);
      Signature signer = Signature.getInstance(algorithm);
      signer.initSign(privateKey);
      signer.update(probe);
      Signature verifier = Signature.getInstance(algorithm);
      verifier.initVerify(publicKey);
      verifier.update(probe);
      matches = verifier.verify(signer.sign());
    } catch (GeneralSecurityException | IllegalArgumentException e) { // a key of another type, bad base64
      throw new IllegalArgumentException(mismatch + " (" + e + ")", e);
    }
    if (!matches) {
      throw new IllegalArgumentException(mismatch + " (the key is another certificate's)");
    }
  }

  private static Collection<? extends Certificate> certificates(String option, Path file, byte[] pem) {
    try {
      return CertificateFactory.getInstance("X.509").generateCertificates(new ByteArrayInputStream(pem));
    } catch (GeneralSecurityException e) {
      throw new IllegalArgumentException("tls " + option + ": " + file + " holds no PEM certificate (" + e + ")",
          e);
    }
  }

  private static byte[] read(String option, Path file) {
    try {
      return Files.readAllBytes(file);
    } catch (IOException e) {
      throw new IllegalArgumentException("tls " + option + ": cannot read " + file + ": " + e, e);
    }
  }

  @Override
  public String toString() {
    return certFile == null ? "TlsFiles[ca=" + caFile + "]"
        : "TlsFiles[ca=" + caFile + ", cert=" + certFile + ", key=" + keyFile + "]";
  }
}
