package lab

import (
	"fmt"
	"path/filepath"
	"strings"
)

// Server is the kind of HTTP server every node of a lab runs on the VIP's
// port 80. Real servers hold their connections in sockets the lab's own
// server never uses (Apache's and Go's dual-stack listeners accept IPv4
// clients on AF_INET6 sockets), so the tests run against them too.
type Server string

// The servers a lab can run.
const (
	// ServerBuiltin is `shoal lab serve` bound to VIP:80: AF_INET sockets.
	ServerBuiltin Server = "builtin"
	// ServerDualStack is `shoal lab serve` bound to [::]:80: IPv4 clients
	// arrive on AF_INET6 sockets with v4-mapped addresses, as with Go's
	// ":80", Node.js and most servers.
	ServerDualStack Server = "dualstack"
	// ServerNginx is Debian's nginx with `listen 80` (IPv4 only), and
	// `listen [::]:80` (IPv6 only) in a lab with IPv6.
	ServerNginx Server = "nginx"
	// ServerApache is Debian's Apache (event MPM) with `Listen 80`, which
	// listens dual-stack on Linux.
	ServerApache Server = "apache"
)

// Servers lists every server type, in the order the CLI shows them.
var Servers = []Server{ServerBuiltin, ServerDualStack, ServerNginx, ServerApache}

// ParseServer returns the server called s ("" is builtin).
func ParseServer(s string) (Server, error) {
	if s == "" {
		return ServerBuiltin, nil
	}
	for _, sv := range Servers {
		if string(sv) == s {
			return sv, nil
		}
	}
	names := make([]string, len(Servers))
	for i, sv := range Servers {
		names[i] = string(sv)
	}
	return "", fmt.Errorf("lab: unknown server %q (want %s)", s, strings.Join(names, ", "))
}

// KeepAliveTimeout is how long the real servers keep an idle keep-alive
// connection open: long enough for any test that holds connections across
// a planned change.
const KeepAliveTimeout = 600

// nginxConfig is a node's nginx configuration: one worker, every path under
// dir, keep-alive without a request limit, and a tiny answer naming the
// node in the body and in the X-Shoal-Node header, as `lab serve` does.
// With ipv6 it also listens on [::]:80 (nginx's IPv6 sockets are IPv6 only).
func nginxConfig(dir, name string, ipv6 bool) string {
	p := func(f string) string { return filepath.Join(dir, f) }
	listen6 := ""
	if ipv6 {
		listen6 = "\n\t\tlisten [::]:80;"
	}
	return fmt.Sprintf(`# written by shoal lab for %[1]s
daemon off;
master_process on;
worker_processes 1;
pid %[2]s;
error_log %[3]s warn;
events { worker_connections 4096; }
http {
	access_log off;
	client_body_temp_path %[4]s;
	proxy_temp_path %[5]s;
	fastcgi_temp_path %[6]s;
	uwsgi_temp_path %[7]s;
	scgi_temp_path %[8]s;
	keepalive_timeout %[9]ds;
	keepalive_requests 1000000;
	default_type text/plain;
	server {
		listen 80;%[11]s
		location / {
			add_header %[10]s %[1]s always;
			return 200 "%[1]s\n";
		}
	}
}
`, name, p("nginx.pid"), p("error.log"), p("body"), p("proxy"), p("fastcgi"), p("uwsgi"), p("scgi"), KeepAliveTimeout, NodeHeader, listen6)
}

// apacheModules is where Debian keeps Apache's loadable modules.
const apacheModules = "/usr/lib/apache2/modules"

// apacheConfig is a node's Apache configuration: the event MPM in one
// process that never retires (a retiring child would close its idle
// keep-alive connections), `Listen 80` as Debian's default, keep-alive
// without a request limit, every file under dir but the document root,
// which the unprivileged children must be able to read.
func apacheConfig(dir, docroot, name, user, group string) string {
	p := func(f string) string { return filepath.Join(dir, f) }
	return fmt.Sprintf(`# written by shoal lab for %[1]s
ServerRoot %[2]s
ServerName %[1]s
DefaultRuntimeDir %[2]s
PidFile %[3]s
ErrorLog %[4]s
LogLevel warn
Listen 80
LoadModule mpm_event_module %[5]s/mod_mpm_event.so
LoadModule authz_core_module %[5]s/mod_authz_core.so
LoadModule headers_module %[5]s/mod_headers.so
LoadModule dir_module %[5]s/mod_dir.so
LoadModule mime_module %[5]s/mod_mime.so
User %[6]s
Group %[7]s
StartServers 1
ServerLimit 1
ThreadsPerChild 64
MaxRequestWorkers 64
MinSpareThreads 1
MaxSpareThreads 64
MaxConnectionsPerChild 0
AsyncRequestWorkerFactor 8
KeepAlive On
MaxKeepAliveRequests 0
KeepAliveTimeout %[8]d
Timeout %[8]d
TypesConfig /dev/null
AddType text/plain .txt
DocumentRoot %[9]s
DirectoryIndex index.txt
<Directory />
	Require all granted
	AllowOverride None
</Directory>
Header always set %[10]s %[1]s
`, name, dir, p("apache.pid"), p("error.log"), apacheModules, user, group, KeepAliveTimeout, docroot, NodeHeader)
}
