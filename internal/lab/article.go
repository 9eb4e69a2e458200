package lab

// articleFigures are the figures of the background article's own lab, per
// strategy it reported ("The stale-state overwrite", Deep Dive, issue 18,
// 16 September 2026): 20 concurrent requests against a limit of 1
// voucher.
var articleFigures = map[string]string{
	"no-lock":     "leaked 16 of 20",
	"redis-naive": "leaked 9 of 20",
	"conditional": "granted 1 of 20",
}

// articleNote says what differs between the article's lab and this one.
const articleNote = "article: its own lab, 20 concurrent requests over HTTP/2 to an application server, limit 1; " +
	"here the requests are goroutines of one process, each on its own PostgreSQL connection, with no HTTP " +
	"in between, and with the think time and pauses above injected, so only the article's direction is comparable, not its counts"
