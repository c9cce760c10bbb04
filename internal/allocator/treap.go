package allocator

// treap is an ordered set of u128 indexes with subtree sizes (an
// order-statistic tree). Insert and delete are O(log n) expected; firstGap
// finds the smallest index not in the set in O(log n) without visiting the
// used indexes one by one.
//
// Priorities are a hash of the key, not random: the shape (and so every
// benchmark) is reproducible, and hashing keeps sequential keys balanced.
type treap struct {
	root *tnode
}

type tnode struct {
	key         u128
	left, right *tnode
	size        int
	prio        uint64
}

func tsize(n *tnode) int {
	if n == nil {
		return 0
	}
	return n.size
}

func (n *tnode) fix() { n.size = 1 + tsize(n.left) + tsize(n.right) }

// mix is splitmix64's finaliser.
func mix(k u128) uint64 {
	z := k.lo ^ (k.hi * 0x9e3779b97f4a7c15)
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Len is the number of keys in the set.
func (t *treap) Len() int { return tsize(t.root) }

// split returns the keys < k and the keys >= k.
func split(n *tnode, k u128) (l, r *tnode) {
	if n == nil {
		return nil, nil
	}
	if n.key.cmp(k) < 0 {
		n.right, r = split(n.right, k)
		n.fix()
		return n, r
	}
	l, n.left = split(n.left, k)
	n.fix()
	return l, n
}

// merge joins two treaps where every key of l is below every key of r.
func merge(l, r *tnode) *tnode {
	switch {
	case l == nil:
		return r
	case r == nil:
		return l
	case l.prio > r.prio:
		l.right = merge(l.right, r)
		l.fix()
		return l
	default:
		r.left = merge(l, r.left)
		r.fix()
		return r
	}
}

// insert adds k; it reports false if k was already present. One descent:
// the path is walked once, which matters as each level is a cache miss.
func (t *treap) insert(k u128) bool {
	nn := &tnode{key: k, size: 1, prio: mix(k)}
	var added bool
	t.root, added = insertNode(t.root, nn)
	return added
}

func insertNode(n, nn *tnode) (*tnode, bool) {
	if n == nil {
		return nn, true
	}
	c := nn.key.cmp(n.key)
	if c == 0 {
		return n, false
	}
	if nn.prio > n.prio {
		// nn becomes the root of this subtree. A duplicate could only be
		// below n; the remaining path is short on average (nn's priority
		// beats n's, so n is low in the tree).
		if subtreeHas(n, nn.key) {
			return n, false
		}
		nn.left, nn.right = split(n, nn.key)
		nn.fix()
		return nn, true
	}
	var added bool
	if c < 0 {
		n.left, added = insertNode(n.left, nn)
	} else {
		n.right, added = insertNode(n.right, nn)
	}
	if added {
		n.size++
	}
	return n, added
}

func subtreeHas(n *tnode, k u128) bool {
	for n != nil {
		switch c := k.cmp(n.key); {
		case c < 0:
			n = n.left
		case c > 0:
			n = n.right
		default:
			return true
		}
	}
	return false
}

// remove deletes k; it reports false if k was absent.
func (t *treap) remove(k u128) bool {
	var removed bool
	t.root, removed = removeNode(t.root, k)
	return removed
}

func removeNode(n *tnode, k u128) (*tnode, bool) {
	if n == nil {
		return nil, false
	}
	var removed bool
	switch c := k.cmp(n.key); {
	case c < 0:
		n.left, removed = removeNode(n.left, k)
	case c > 0:
		n.right, removed = removeNode(n.right, k)
	default:
		return merge(n.left, n.right), true
	}
	if removed {
		n.size--
	}
	return n, removed
}

func (t *treap) contains(k u128) bool { return subtreeHas(t.root, k) }

// depth is the height of the tree (tests: balance check).
func (t *treap) depth() int {
	var rec func(*tnode) int
	rec = func(n *tnode) int {
		if n == nil {
			return 0
		}
		return 1 + max(rec(n.left), rec(n.right))
	}
	return rec(t.root)
}

// firstGap returns the smallest index not in the set. Keys are distinct and
// non-negative, so the key of rank r is >= r, with equality exactly when
// 0..r are all present: a monotone predicate the descent can binary-search.
func (t *treap) firstGap() u128 {
	var packed uint64 // keys known to form the prefix 0..packed-1
	n := t.root
	for n != nil {
		r := packed + uint64(tsize(n.left))
		if n.key.hi == 0 && n.key.lo == r {
			packed = r + 1
			n = n.right
		} else {
			n = n.left
		}
	}
	return u128{0, packed}
}

// walk calls f for every key in ascending order (tests and rebuilds).
func (t *treap) walk(f func(u128)) {
	var rec func(*tnode)
	rec = func(n *tnode) {
		if n == nil {
			return
		}
		rec(n.left)
		f(n.key)
		rec(n.right)
	}
	rec(t.root)
}
