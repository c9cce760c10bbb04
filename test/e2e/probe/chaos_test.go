package probe

import (
	"bytes"
	"net"
	"testing"
	"time"
)

func TestChaosRoundTrip(t *testing.T) {
	mac, _ := net.ParseMAC("02:42:ac:12:00:03")
	rep := ChaosReport{Start: time.Unix(100, 0), End: time.Unix(200, 0), ARPIntervalMS: 100, Targets: []*ChaosTarget{
		{IP: "172.18.255.200", ARPStart: time.Unix(100, 1), ARPEnd: time.Unix(199, 0),
			ARP:       []ARPRecord{{At: time.Unix(101, 5), MAC: mac, Reply: true}, {At: time.Unix(102, 7), MAC: mac}},
			NewConns:  []Record{{Sent: time.Unix(103, 0), OK: true}, {Sent: time.Unix(104, 0), Err: "dial tcp 172.18.255.200:80: i/o timeout"}},
			KeepAlive: KeepAliveReport{Broken: 1, Conns: []ConnReport{{ID: 0, Broken: 1, Breaks: []Break{{At: time.Unix(105, 0), Kind: BreakReset}}}}}},
		{IP: "172.18.255.201", ARPErr: "no interface"},
	}}
	var b bytes.Buffer
	if err := WriteChaos(&b, rep); err != nil {
		t.Fatal(err)
	}
	got, err := ParseChaos("noise\n" + b.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Targets) != 2 {
		t.Fatalf("targets %+v", got.Targets)
	}
	a := got.Targets[0]
	if len(a.ARP) != 2 || !a.ARP[0].At.Equal(time.Unix(101, 5)) || !a.ARP[0].Reply || a.ARP[1].Reply || a.ARP[0].MAC.String() != mac.String() {
		t.Errorf("ARP records %+v", a.ARP)
	}
	if len(a.NewConns) != 2 || !a.NewConns[0].OK || a.NewConns[1].OK || a.NewConns[1].Err != "dial tcp 172.18.255.200:80: i/o timeout" {
		t.Errorf("new connections %+v", a.NewConns)
	}
	if !a.ARPStart.Equal(time.Unix(100, 1)) || a.KeepAlive.Broken != 1 || !a.KeepAlive.Conns[0].Breaks[0].At.Equal(time.Unix(105, 0)) {
		t.Errorf("summary %+v", a)
	}
	if got.Targets[1].ARPErr != "no interface" || len(got.Targets[1].ARP) != 0 {
		t.Errorf("second target %+v", got.Targets[1])
	}
	if _, err := ParseChaos("chaos-arp 1 2 3 reply\n"); err == nil {
		t.Error("output without a summary parsed")
	}
}
