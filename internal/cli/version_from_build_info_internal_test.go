package cli

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A tagged release reports its own version; every other build reports the
// source's Version with "+devel", so a binary never claims a release it is
// not.
func TestVersionFromBuildInfo(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ main, want string }{
		{"v0.1.0", "v0.1.0"},                                               // go install ...@v0.1.0
		{"v0.2.0", "v0.2.0"},                                               // a later release, whatever the const says
		{"v1.0.0-rc.1", "v1.0.0-rc.1"},                                     // a tagged pre-release
		{"(devel)", Version + "+devel"},                                    // go build or go run in a clone
		{"", Version + "+devel"},                                           // no build info (go test)
		{"v0.0.0-20261202080312-3e348de1a2b3", Version + "+devel"},         // an untagged commit, no tag before it
		{"v0.1.1-0.20261202080312-3e348de1a2b3", Version + "+devel"},       // an untagged commit after v0.1.0
		{"v1.0.0-rc.1.0.20261202080312-3e348de1a2b3", Version + "+devel"},  // an untagged commit after a pre-release
		{"v0.1.0+dirty", Version + "+devel"},                               // the tagged commit, modified
		{"v0.1.1-0.20261202080312-3e348de1a2b3+dirty", Version + "+devel"}, // an untagged commit, modified
		{"0.1.0", Version + "+devel"},                                      // not a module version
	} {
		require.Equal(t, c.want, versionFrom(c.main), "main module version %q", c.main)
	}
	require.Regexp(t, `^v\d+\.\d+\.\d+$`, Version)
}
