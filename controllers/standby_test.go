package controllers_test

import (
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/controllers"
)

// A replica that is not the leader still loads the configuration for its metrics:
// config_loaded_bool becomes 1 and config_stale_bool follows the validity of the
// newest configuration, while it allocates nothing. Once it is elected it rebuilds
// the allocator and allocates.
func TestStandbyReportsConfigMetrics(t *testing.T) {
	h := newHarness(t, func(o *controllers.Options) { o.LeaderElect = true })
	// Someone else holds the Lease for an hour: this replica stays standby.
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.installNS, Name: controllers.LeaderElectionID},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To("another-replica"),
			LeaseDurationSeconds: ptr.To(int32(3600)),
			AcquireTime:          &metav1.MicroTime{Time: time.Now()},
			RenewTime:            &metav1.MicroTime{Time: time.Now()},
		},
	}
	h.create(lease)
	h.pool("first-pool", "172.18.255.200-172.18.255.250")
	h.create(h.service("svc1", nil))
	controllers.ResetConfigMetrics()
	h.start()

	metric := func(name string, want float64) func() (bool, string) {
		return func() (bool, string) {
			v := gauge(t, name, "")
			return v == want, fmt.Sprintf("%s = %v", name, v)
		}
	}
	h.eventually("config_loaded_bool = 1 on the standby", metric("metallb_k8s_client_config_loaded_bool", 1))
	h.eventually("config_stale_bool = 0 on the standby", metric("metallb_k8s_client_config_stale_bool", 0))
	// An overlapping pool makes the newest configuration invalid.
	h.pool("overlap", "172.18.255.250/32")
	h.eventually("config_stale_bool = 1 on the standby", metric("metallb_k8s_client_config_stale_bool", 1))
	if got := ingress(h.get("svc1")); len(got) != 0 {
		t.Errorf("the standby allocated %v", got)
	}
	if err := k8s.Delete(h.ctx, &v1beta1.IPAddressPool{ObjectMeta: metav1.ObjectMeta{Namespace: h.installNS, Name: "overlap"}}); err != nil {
		t.Fatal(err)
	}
	h.eventually("config_stale_bool = 0 again", metric("metallb_k8s_client_config_stale_bool", 0))

	// The other holder goes away: this replica takes the Lease and allocates.
	if err := k8s.Delete(h.ctx, lease); err != nil {
		t.Fatalf("deleting the lease: %v", err)
	}
	h.waitIPs("svc1", "172.18.255.200")
}
