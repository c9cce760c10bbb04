package config

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseAddresses(t *testing.T) {
	tests := []struct {
		in          string
		first, last string
		str         string // String() of the result
		wantErr     string // substring of the error; "" = must parse
	}{
		{in: "172.18.255.200-172.18.255.250", first: "172.18.255.200", last: "172.18.255.250", str: "172.18.255.200-172.18.255.250"},
		{in: " 172.18.255.200 - 172.18.255.250 ", first: "172.18.255.200", last: "172.18.255.250", str: "172.18.255.200-172.18.255.250"},
		{in: "192.168.10.0/24", first: "192.168.10.0", last: "192.168.10.255", str: "192.168.10.0/24"},
		{in: "192.168.10.7/24", first: "192.168.10.0", last: "192.168.10.255", str: "192.168.10.0/24"},
		{in: "10.0.0.5/32", first: "10.0.0.5", last: "10.0.0.5", str: "10.0.0.5/32"},
		{in: "10.0.0.5-10.0.0.5", first: "10.0.0.5", last: "10.0.0.5", str: "10.0.0.5/32"},
		{in: "10.0.0.0-10.0.0.255", first: "10.0.0.0", last: "10.0.0.255", str: "10.0.0.0/24"},
		{in: "0.0.0.0/0", first: "0.0.0.0", last: "255.255.255.255", str: "0.0.0.0/0"},
		{in: "fc00:f853:ccd:e799::/124", first: "fc00:f853:ccd:e799::", last: "fc00:f853:ccd:e799::f", str: "fc00:f853:ccd:e799::/124"},
		{in: "2001:db8::1-2001:db8::ff", first: "2001:db8::1", last: "2001:db8::ff", str: "2001:db8::1-2001:db8::ff"},
		{in: "2001:db8::/64", first: "2001:db8::", last: "2001:db8::ffff:ffff:ffff:ffff", str: "2001:db8::/64"},
		{in: "::/0", first: "::", last: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", str: "::/0"},

		{in: "", wantErr: `invalid CIDR ""`},
		{in: "   ", wantErr: `invalid CIDR "   "`},
		{in: "10.0.0.1", wantErr: `invalid CIDR "10.0.0.1": no prefix length (write 10.0.0.1/32`},
		{in: "2001:db8::1", wantErr: `write 2001:db8::1/128`},
		{in: "10.0.0.0/33", wantErr: `invalid CIDR "10.0.0.0/33"`},
		{in: "10.0.0/24", wantErr: `invalid CIDR "10.0.0/24"`},
		{in: "010.0.0.0/24", wantErr: `invalid CIDR "010.0.0.0/24"`},
		{in: "::ffff:10.0.0.0/120", wantErr: "IPv4-mapped"},
		{in: "fe80::1%eth0/64", wantErr: `invalid CIDR`},
		{in: "hello", wantErr: `invalid CIDR "hello"`},
		{in: "10.0.0.9-10.0.0.1", wantErr: `invalid IP range "10.0.0.9-10.0.0.1": start IP "10.0.0.9" is after the end IP "10.0.0.1"`},
		{in: "10.0.0.1-2001:db8::1", wantErr: `are of different families`},
		{in: "10.0.0.1-", wantErr: `invalid IP range "10.0.0.1-": invalid end IP ""`},
		{in: "-10.0.0.1", wantErr: `invalid start IP ""`},
		{in: "10.0.0.1-10.0.0.5-10.0.0.9", wantErr: `invalid end IP "10.0.0.5-10.0.0.9"`},
		{in: "10.0.0.1/32-10.0.0.5", wantErr: `invalid start IP "10.0.0.1/32"`},
		{in: "fe80::1%eth0-fe80::2", wantErr: `zones are not allowed`},
		{in: "::ffff:10.0.0.1-::ffff:10.0.0.2", wantErr: `IPv4-mapped`},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			r, err := ParseAddresses(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseAddresses(%q) = %v, %v; want error containing %q", tc.in, r, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseAddresses(%q): %v", tc.in, err)
			}
			want := Range{First: netip.MustParseAddr(tc.first), Last: netip.MustParseAddr(tc.last)}
			if r != want {
				t.Errorf("ParseAddresses(%q) = %v..%v, want %v..%v", tc.in, r.First, r.Last, want.First, want.Last)
			}
			if got := r.String(); got != tc.str {
				t.Errorf("String() = %q, want %q", got, tc.str)
			}
		})
	}
}

func TestRangeContainsOverlaps(t *testing.T) {
	mk := func(s string) Range {
		r, err := ParseAddresses(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := mk("10.0.0.10-10.0.0.20")
	for _, tc := range []struct {
		ip   string
		want bool
	}{{"10.0.0.9", false}, {"10.0.0.10", true}, {"10.0.0.15", true}, {"10.0.0.20", true}, {"10.0.0.21", false}, {"::a00:f", false}} {
		if got := r.Contains(netip.MustParseAddr(tc.ip)); got != tc.want {
			t.Errorf("%v.Contains(%s) = %v, want %v", r, tc.ip, got, tc.want)
		}
	}
	for _, tc := range []struct {
		other string
		want  bool
	}{
		{"10.0.0.0-10.0.0.9", false},
		{"10.0.0.0-10.0.0.10", true},
		{"10.0.0.20/32", true},
		{"10.0.0.21-10.0.0.30", false},
		{"10.0.0.0/8", true},
		{"10.0.0.12-10.0.0.13", true},
		{"::a00:a-::a00:14", false}, // same numbers, other family
	} {
		o := mk(tc.other)
		if got := r.Overlaps(o); got != tc.want {
			t.Errorf("%v.Overlaps(%v) = %v, want %v", r, o, got, tc.want)
		}
		if got := o.Overlaps(r); got != tc.want {
			t.Errorf("%v.Overlaps(%v) = %v, want %v (not symmetric)", o, r, got, tc.want)
		}
	}
}
