package console

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/dlview"
)

// defaultLimit is how many dead letters a page lists unless asked.
const defaultLimit = 200

// page is what every template gets.
type page struct {
	Title    string
	ReadOnly bool
	CSRF     string
	Flash    string
	Error    string
	Data     any
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, name string, status int, data any) {
	p := page{Title: c.o.title, ReadOnly: c.o.readOnly, CSRF: c.csrf, Data: data}
	q := r.URL.Query()
	if n := q.Get("replayed"); n != "" {
		p.Flash = "Replayed " + n + " dead letters."
	}
	if n := q.Get("deleted"); n != "" {
		p.Flash = "Deleted " + n + " dead letters."
	}
	var buf bytes.Buffer
	if err := c.pages[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		c.o.log.ErrorContext(r.Context(), "console: rendering a page failed", "page", name, "error", err)
		http.Error(w, "console: rendering the page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	c.render(w, r, "error.html", status, err.Error())
}

// readFailed is the status of a page whose endpoint could not be read: 404
// when it does not exist (a mistyped address, an endpoint removed), 502
// when the broker did not answer.
func readFailed(err error) int {
	if errors.Is(err, bus.ErrUnknownEndpoint) {
		return http.StatusNotFound
	}
	return http.StatusBadGateway
}

// endpointRow is one endpoint of the index page and of /api/stats. Depth
// and DeadLetters are nil (null) when the broker could not be read: Error
// says why.
type endpointRow struct {
	Endpoint    string   `json:"endpoint"`
	Depth       *int     `json:"depth"`
	DeadLetters *int     `json:"dead_letters"`
	Rate        *float64 `json:"messages_per_second,omitempty"`
	RateKind    string   `json:"rate_kind"` // "delivered" or "depth change"
	Error       string   `json:"error,omitempty"`
}

func (c *Console) rows(r *http.Request) ([]endpointRow, error) {
	eps, err := c.endpoints(r.Context())
	if err != nil {
		return nil, err
	}
	rows := make([]endpointRow, len(eps))
	for i, ep := range eps {
		row := endpointRow{Endpoint: ep}
		var errs []string
		if n, err := c.m.QueueDepth(r.Context(), ep); err != nil {
			errs = append(errs, err.Error())
		} else {
			row.Depth = &n
		}
		if n, err := c.m.CountDeadLetters(r.Context(), ep); err != nil {
			errs = append(errs, err.Error())
		} else {
			row.DeadLetters = &n
		}
		row.Rate, row.RateKind = c.rates.get(r, c.m, ep, row.Depth)
		row.Error = strings.Join(slices.Compact(errs), "; ")
		rows[i] = row
	}
	return rows, nil
}

func (c *Console) index(w http.ResponseWriter, r *http.Request) {
	rows, err := c.rows(r)
	if err != nil {
		c.fail(w, r, http.StatusBadGateway, err)
		return
	}
	c.render(w, r, "index.html", http.StatusOK, rows)
}

func (c *Console) stats(w http.ResponseWriter, r *http.Request) {
	rows, err := c.rows(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(rows)
}

// filterForm is the filter of an endpoint's page, as the form holds it.
type filterForm struct {
	Name, Error, Since, Until string
	Limit                     int
}

const formTime = "2006-01-02T15:04"

// filterKeys are the query keys of an endpoint page's filter.
var filterKeys = []string{"name", "error", "since", "until", "limit"}

// Query is the filter as the endpoint page's query, without the fields
// left empty: the action forms carry it so as to come back to the same
// list.
func (ff filterForm) Query() string {
	q := url.Values{}
	for k, v := range map[string]string{"name": ff.Name, "error": ff.Error, "since": ff.Since, "until": ff.Until} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if ff.Limit != defaultLimit {
		q.Set("limit", strconv.Itoa(ff.Limit))
	}
	return q.Encode()
}

func parseFilter(r *http.Request, ep string) (bus.DeadLetterFilter, filterForm, error) {
	q := r.URL.Query()
	ff := filterForm{Name: q.Get("name"), Error: q.Get("error"), Since: q.Get("since"), Until: q.Get("until"), Limit: defaultLimit}
	f := bus.DeadLetterFilter{Endpoint: ep, Name: ff.Name, Reason: ff.Error}
	var err error
	if ff.Since != "" {
		if f.Since, err = time.Parse(formTime, ff.Since); err != nil {
			return f, ff, fmt.Errorf("since %q: want %s (UTC)", ff.Since, formTime)
		}
	}
	if ff.Until != "" {
		if f.Until, err = time.Parse(formTime, ff.Until); err != nil {
			return f, ff, fmt.Errorf("until %q: want %s (UTC)", ff.Until, formTime)
		}
	}
	if s := q.Get("limit"); s != "" {
		if ff.Limit, err = strconv.Atoi(s); err != nil || ff.Limit < 1 {
			return f, ff, fmt.Errorf("limit %q: want a number above 0", s)
		}
	}
	f.Limit = ff.Limit
	return f, ff, nil
}

type endpointPage struct {
	Endpoint    string
	Filter      filterForm
	DeadLetters []dlview.DeadLetter
	Total       int
	TotalErr    string // why Total could not be read; the list itself was
}

func (c *Console) endpoint(w http.ResponseWriter, r *http.Request) {
	ep := r.PathValue("endpoint")
	f, ff, err := parseFilter(r, ep)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	dls, err := c.m.ListDeadLetters(r.Context(), f)
	if err != nil {
		c.fail(w, r, readFailed(err), err)
		return
	}
	p := endpointPage{Endpoint: ep, Filter: ff, DeadLetters: make([]dlview.DeadLetter, len(dls))}
	for i, dl := range dls {
		p.DeadLetters[i] = dlview.Of(dl)
	}
	if p.Total, err = c.m.CountDeadLetters(r.Context(), ep); err != nil {
		p.TotalErr = err.Error()
	}
	c.render(w, r, "endpoint.html", http.StatusOK, p)
}

type messagePage struct {
	Endpoint string
	D        dlview.DeadLetter
}

func (c *Console) message(w http.ResponseWriter, r *http.Request) {
	ep, id := r.PathValue("endpoint"), r.PathValue("id")
	dls, err := c.m.ListDeadLetters(r.Context(), bus.DeadLetterFilter{Endpoint: ep, IDs: []string{id}, Limit: 1})
	if err != nil {
		c.fail(w, r, readFailed(err), err)
		return
	}
	if len(dls) == 0 {
		c.fail(w, r, http.StatusNotFound, fmt.Errorf("endpoint %s has no dead letter %s (replayed or deleted?)", ep, id))
		return
	}
	c.render(w, r, "message.html", http.StatusOK, messagePage{Endpoint: ep, D: dlview.Of(dls[0])})
}

// act replays or deletes the dead letters a form selected: one (the
// button's "one") or the ticked "id"s.
func (c *Console) act(w http.ResponseWriter, r *http.Request) {
	if c.o.readOnly {
		c.fail(w, r, http.StatusForbidden, fmt.Errorf("the console is read-only"))
		return
	}
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(c.csrf)) != 1 {
		c.fail(w, r, http.StatusForbidden, fmt.Errorf("the form's CSRF token is missing or wrong: reload the page"))
		return
	}
	ep := r.PathValue("endpoint")
	ids := r.PostForm["id"]
	if one := r.PostForm.Get("one"); one != "" {
		ids = []string{one}
	}
	if len(ids) == 0 {
		c.fail(w, r, http.StatusBadRequest, fmt.Errorf("no dead letter selected"))
		return
	}
	f := bus.DeadLetterFilter{Endpoint: ep, IDs: ids}
	var n int
	var err error
	verb := "deleted"
	if strings.HasSuffix(r.URL.Path, "/replay") {
		verb = "replayed"
		n, err = c.m.ReplayDeadLetters(r.Context(), f, bus.Replay{To: r.PostForm.Get("to"), By: c.o.user}, nil)
	} else {
		n, err = c.m.DeleteDeadLetters(r.Context(), f, nil)
	}
	c.o.log.InfoContext(r.Context(), "console: dead letters "+verb, "endpoint", ep, "count", n, "remote", r.RemoteAddr)
	if err != nil {
		status, done := http.StatusBadGateway, fmt.Errorf("%s %d, then: %w", verb, n, err)
		var unknown *bus.UnknownEndpointError
		if errors.As(err, &unknown) {
			// The endpoint of the address does not exist (404), or a
			// destination has no queue (400): the form's "Replay to", or
			// the endpoint a dead letter failed on, ep's own included.
			// The dead letter it stopped at stays where it was.
			status = http.StatusBadRequest
			if !unknown.Destination {
				status = http.StatusNotFound
			}
			if n == 0 {
				done = fmt.Errorf("nothing %s: %w", verb, err)
			}
		}
		c.fail(w, r, status, done)
		return
	}
	// Back to the list the form came from: its filter (only the filter's
	// keys of it), and what was done.
	back := url.Values{}
	if from, err := url.ParseQuery(r.PostForm.Get("filter")); err == nil {
		for _, k := range filterKeys {
			if v := from.Get(k); v != "" {
				back.Set(k, v)
			}
		}
	}
	back.Set(verb, strconv.Itoa(n))
	http.Redirect(w, r, "/endpoints/"+url.PathEscape(ep)+"?"+back.Encode(), http.StatusSeeOther)
}

// rates computes messages per second per endpoint between two requests of
// the stats: from the broker's delivery count when it keeps one
// (bus.DeliveryCounter), else from the change of the queue's depth.
type rates struct {
	now  func() time.Time
	mu   sync.Mutex
	last map[string]sample // the sample the current rate was computed from
	rate map[string]*float64
}

type sample struct {
	at    time.Time
	count uint64
	depth int
}

// minGap is the shortest time between two samples a rate is computed
// from; a request sooner gets the rate computed last.
const minGap = 500 * time.Millisecond

// get returns ep's rate and its kind. depth is nil when it could not be
// read: a rate of depth change is then unknown, and the sample skipped.
func (rs *rates) get(r *http.Request, m bus.DeadLetterManager, ep string, depth *int) (*float64, string) {
	s := sample{at: rs.now()}
	kind := "depth change"
	dc, counts := m.(bus.DeliveryCounter)
	if !counts {
		if depth == nil {
			return nil, kind
		}
		s.depth = *depth
	} else {
		n, err := dc.Delivered(r.Context(), ep)
		if err != nil {
			return nil, ""
		}
		s.count, kind = n, "delivered"
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	prev, ok := rs.last[ep]
	if !ok {
		rs.last[ep] = s
		return nil, kind
	}
	gap := s.at.Sub(prev.at)
	if gap < minGap {
		return rs.rate[ep], kind
	}
	v := float64(s.depth-prev.depth) / gap.Seconds()
	if counts {
		v = float64(s.count-prev.count) / gap.Seconds()
	}
	if rs.rate == nil {
		rs.rate = map[string]*float64{}
	}
	rs.last[ep], rs.rate[ep] = s, &v
	return &v, kind
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "–"
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}
