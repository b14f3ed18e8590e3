/* podnet.so: gives a pod's processes an address of their own, for the test node agent.

   Every exec-mode pod of the node agent shares the host's network namespace, but gets its
   own address (POLYRL_AGENT_POD_IP) from a range routed to loopback. Loaded with
   LD_PRELOAD, this library makes that address behave like a pod's network namespace:

   - bind() to the wildcard address (0.0.0.0, or :: on a dual-stack socket) binds the pod's
     address instead, so two pods can listen on the same port, as they can on a real node,
     and each is reached at its own status.podIP;
   - connect() to localhost (127.0.0.1 or ::1) on a port where the pod's address has a
     listener goes to that listener, as localhost reaches the pod's own servers in a pod
     (torchrun's rendezvous store, a sidecar); on any other port it goes to the host, where
     the test's NATS and API server listen.

   Every other call is left as it is. Built by the agent with the system C compiler; a test
   fake, nothing ships with it. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);
typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);

static int pod_ip(struct in_addr *out) {
    const char *text = getenv("POLYRL_AGENT_POD_IP");
    return text != NULL && inet_pton(AF_INET, text, out) == 1;
}

static int v6only(int fd) {
    int value = 0;
    socklen_t len = sizeof(value);
    return getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &value, &len) == 0 && value;
}

/* Does a TCP socket listen on ip:port? /proc/net/tcp lists IPv4 sockets (address as the
   hex of its 32-bit value in host order) and /proc/net/tcp6 IPv6 ones, where an
   IPv4-mapped address ends in the same eight digits; state 0A is LISTEN. */
static int listening(struct in_addr ip, unsigned port) {
    static const char *tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    char want[9], line[512];
    snprintf(want, sizeof(want), "%08X", (unsigned)ip.s_addr);
    for (int t = 0; t < 2; t++) {
        FILE *f = fopen(tables[t], "r");
        if (f == NULL) continue;
        while (fgets(line, sizeof(line), f) != NULL) {
            char local[64];
            unsigned lport, state;
            if (sscanf(line, " %*d: %63[0-9A-Fa-f]:%X %*[0-9A-Fa-f]:%*X %X", local, &lport,
                       &state) != 3)
                continue;
            size_t n = strlen(local);
            if (state == 0x0A && lport == port && n >= 8 && strcasecmp(local + n - 8, want) == 0) {
                fclose(f);
                return 1;
            }
        }
        fclose(f);
    }
    return 0;
}

static void mapped(struct in6_addr *out, struct in_addr ip) {
    memset(out, 0, sizeof(*out));
    out->s6_addr[10] = 0xff;
    out->s6_addr[11] = 0xff;
    memcpy(&out->s6_addr[12], &ip, sizeof(ip));
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static connect_fn real_connect = NULL;
    struct in_addr ip;
    if (real_connect == NULL) real_connect = (connect_fn)dlsym(RTLD_NEXT, "connect");
    if (addr == NULL || !pod_ip(&ip)) return real_connect(fd, addr, len);

    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in v4;
        memcpy(&v4, addr, sizeof(v4));
        if (v4.sin_addr.s_addr == htonl(INADDR_LOOPBACK) && listening(ip, ntohs(v4.sin_port))) {
            v4.sin_addr = ip;
            return real_connect(fd, (const struct sockaddr *)&v4, sizeof(v4));
        }
    } else if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 v6;
        struct in6_addr loop4;
        struct in_addr lo = {htonl(INADDR_LOOPBACK)};
        memcpy(&v6, addr, sizeof(v6));
        mapped(&loop4, lo);
        int loopback = IN6_IS_ADDR_LOOPBACK(&v6.sin6_addr) ||
                       memcmp(&v6.sin6_addr, &loop4, sizeof(loop4)) == 0;
        if (loopback && listening(ip, ntohs(v6.sin6_port))) {
            mapped(&v6.sin6_addr, ip);
            return real_connect(fd, (const struct sockaddr *)&v6, sizeof(v6));
        }
    }
    return real_connect(fd, addr, len);
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind = NULL;
    struct in_addr ip;
    if (real_bind == NULL) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    if (addr == NULL || !pod_ip(&ip)) return real_bind(fd, addr, len);

    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in v4;
        memcpy(&v4, addr, sizeof(v4));
        if (v4.sin_addr.s_addr == htonl(INADDR_ANY)) {
            v4.sin_addr = ip;
            return real_bind(fd, (const struct sockaddr *)&v4, sizeof(v4));
        }
    } else if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 v6;
        memcpy(&v6, addr, sizeof(v6));
        if (IN6_IS_ADDR_UNSPECIFIED(&v6.sin6_addr) && !v6only(fd)) {
            mapped(&v6.sin6_addr, ip); /* ::ffff:<pod address> */
            return real_bind(fd, (const struct sockaddr *)&v6, sizeof(v6));
        }
    }
    return real_bind(fd, addr, len);
}
