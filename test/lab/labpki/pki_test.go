package labpki

import (
	"crypto/x509"
	"encoding/pem"
	"net"
	"strings"
	"testing"
)

func TestIssueVerifiesAgainstCA(t *testing.T) {
	ca, err := NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue(CertRequest{CommonName: "kube-apiserver", DNSNames: []string{"kubernetes"},
		IPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 200, 1, 1)}, Server: true})
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(kp.CertPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	for _, name := range []string{"127.0.0.1", "10.200.1.1", "kubernetes"} {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: name}); err != nil {
			t.Errorf("serving certificate does not verify for %s: %v", name, err)
		}
	}

	client, err := ca.Issue(CertRequest{CommonName: "kubernetes-admin", Organization: []string{"system:masters"}, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	block, _ = pem.Decode(client.CertPEM)
	cc, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cc.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate does not verify: %v", err)
	}
	if cc.Subject.Organization[0] != "system:masters" {
		t.Errorf("client groups = %v", cc.Subject.Organization)
	}
	kc := string(Kubeconfig("https://127.0.0.1:36443", ca.CertPEM(), "kubernetes-admin", client))
	if !strings.Contains(kc, "server: https://127.0.0.1:36443") || !strings.Contains(kc, "client-key-data: ") {
		t.Errorf("kubeconfig misses server or key:\n%s", kc)
	}
}
