package main

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"

	"golang.org/x/crypto/bcrypt"
)

// auth checks who a request comes from. A nil *auth lets everyone in as
// "anonymous" (loopback or --insecure).
type auth struct {
	users map[string][]byte // htpasswd: user to bcrypt hash
	token string            // bearer token
}

const tokenCookie = "agentfleet_console_token"

func loadAuth(basicFile, tokenFile string) (*auth, error) {
	switch {
	case basicFile != "":
		b, err := os.ReadFile(basicFile)
		if err != nil {
			return nil, fmt.Errorf("--basic-auth-file: %w", err)
		}
		users, err := parseHtpasswd(b)
		if err != nil {
			return nil, fmt.Errorf("--basic-auth-file %s: %w", basicFile, err)
		}
		return &auth{users: users}, nil
	case tokenFile != "":
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--auth-token-file: %w", err)
		}
		tok := strip(b)
		if len(tok) < 16 {
			return nil, fmt.Errorf("--auth-token-file %s: the token must be at least 16 characters", tokenFile)
		}
		return &auth{token: tok}, nil
	}
	return nil, nil
}

// parseHtpasswd reads "user:hash" lines; only bcrypt hashes are accepted.
func parseHtpasswd(b []byte) (map[string][]byte, error) {
	users := map[string][]byte{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		user, hash, ok := strings.Cut(line, ":")
		if !ok || user == "" {
			return nil, fmt.Errorf("line %d is not user:hash", n)
		}
		if _, err := bcrypt.Cost([]byte(hash)); err != nil {
			return nil, fmt.Errorf("line %d (%s): only bcrypt hashes are accepted (htpasswd -B): %v", n, user, err)
		}
		users[user] = []byte(hash)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(users) == 0 {
		return nil, errors.New("no users")
	}
	return users, nil
}

func (a *auth) kind() string {
	switch {
	case a == nil:
		return "none"
	case a.users != nil:
		return "basic"
	}
	return "token"
}

// user returns the authenticated user of a request, or "" when the request
// is refused. A token in ?token= is accepted once and kept in a cookie by
// the caller (EventSource cannot send headers).
func (a *auth) user(r *http.Request) string {
	if a == nil {
		return "anonymous"
	}
	if a.users != nil {
		u, p, ok := r.BasicAuth()
		if !ok {
			return ""
		}
		hash, known := a.users[u]
		if !known {
			// Spend the same time as for a known user.
			hash = dummyHash
		}
		if bcrypt.CompareHashAndPassword(hash, []byte(p)) != nil || !known {
			return ""
		}
		return u
	}
	var got string
	if h, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		got = h
	} else if c, err := r.Cookie(tokenCookie); err == nil {
		got = c.Value
	} else {
		got = r.URL.Query().Get("token")
	}
	if got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(a.token)) == 1 {
		return "token"
	}
	return ""
}

var dummyHash, _ = bcrypt.GenerateFromPassword([]byte("not a password"), bcrypt.MinCost)

// refuse answers an unauthenticated request.
func (a *auth) refuse(w http.ResponseWriter) {
	if a.users != nil {
		w.Header().Set("WWW-Authenticate", `Basic realm="agentfleet console", charset="UTF-8"`)
	}
	http.Error(w, "authentication required", http.StatusUnauthorized)
}

// keepToken turns a ?token= login into a cookie and redirects to the same
// page without the token in its URL. It reports whether it answered. A
// wrong token gets a 401 and no cookie: the cookie is only ever a token
// that was checked. secure marks the cookie for https only (hosts.go).
func (a *auth) keepToken(w http.ResponseWriter, r *http.Request, secure bool) bool {
	if a == nil || a.token == "" || r.Method != http.MethodGet || !r.URL.Query().Has("token") {
		return false
	}
	got := r.URL.Query().Get("token")
	if subtle.ConstantTimeCompare([]byte(got), []byte(a.token)) != 1 {
		a.refuse(w)
		return true
	}
	http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: got, Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure})
	q := r.URL.Query()
	q.Del("token")
	u := url.URL{Path: localPath(r.URL.Path), RawQuery: q.Encode()}
	http.Redirect(w, r, u.String(), http.StatusSeeOther)
	return true
}

// localPath is p with its leading slashes (and backslashes, which
// browsers read as slashes) collapsed to one: "//evil.example/" (or
// "/%2Fevil.example/", "/%5Cevil.example/") as a Location is another
// site's address; "/evil.example/" is a page of this one.
func localPath(p string) string {
	return "/" + strings.TrimLeft(p, "/\\")
}

// csrf makes and checks the per-user tokens control POSTs carry in
// X-CSRF-Token. The page reads its token from /api/session, which another
// origin cannot read.
type csrf struct{ key []byte }

func newCSRF() csrf {
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return csrf{key: k}
}

func (c csrf) token(user string) string {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte(user))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func (c csrf) valid(user, got string) bool {
	return got != "" && hmac.Equal([]byte(got), []byte(c.token(user)))
}
