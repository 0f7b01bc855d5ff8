"""SplitMix64 random numbers, a port of common/random.{h,cc} bit for bit:
data order is a pure function of the seed, the same in every worker."""

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
UINT64_MAX = _MASK


def _mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class Rng:
    """Independent streams for one seed (one per epoch, per tensor)."""

    def __init__(self, seed, stream):
        s = _mix(_mix((seed + _GAMMA) & _MASK) ^ ((stream * 0xD1B54A32D192ED03 + 1) & _MASK))
        self._state = s

    def next_u64(self):
        self._state = (self._state + _GAMMA) & _MASK
        return _mix(self._state)

    def uniform(self):
        """Uniform in [0, 1) with 53 random bits."""
        return (self.next_u64() >> 11) * 2.0**-53

    def below(self, n):
        """Uniform integer in [0, n), unbiased (n > 0)."""
        # Rejection of the top partial range, as the C++ does.
        limit = UINT64_MAX - UINT64_MAX % n
        x = self.next_u64()
        while x >= limit:
            x = self.next_u64()
        return x % n


def random_permutation(rng, n):
    """A uniformly random permutation of [0, n) (Fisher-Yates)."""
    p = list(range(n))
    for i in range(n - 1, 0, -1):
        j = rng.below(i + 1)
        p[i], p[j] = p[j], p[i]
    return p
