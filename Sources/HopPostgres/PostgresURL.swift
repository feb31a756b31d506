import Foundation
import HopStore
import PostgresNIO

/// Where a PostgreSQL database is and how to reach it, read from a URL in libpq's form:
///
///     postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=require]
///     postgres://USER@/DATABASE?host=/var/run/postgresql        (a Unix socket's folder)
///
/// One parameter is Hop's own, not libpq's: `connection_limit=N`, the most connections the
/// store's pool opens (``connectionLimit``; a fleet sizes the server's `max_connections` by it).
///
/// The password comes from the URL, else `PGPASSWORD`, else the password file (`passfile=`,
/// `PGPASSFILE` or `~/.pgpass`, in libpq's format). ``redacted`` is the URL with its password
/// replaced by `***`: the only form that logs, errors and `hopctl` ever show.
public struct PostgresURL: Sendable, Equatable, CustomStringConvertible, CustomReflectable {
    /// How the connection is protected, as libpq's `sslmode` names it.
    public enum TLSMode: String, Sendable {
        /// No TLS.
        case disable
        /// TLS when the server offers it (libpq's default over TCP); the certificate is not checked.
        case prefer
        /// TLS or no connection; the certificate is not checked (libpq's `require`).
        case require
        /// TLS with the server's certificate checked against the trusted roots, not its name.
        case verifyCA = "verify-ca"
        /// TLS with the server's certificate and host name checked.
        case verifyFull = "verify-full"
    }

    /// The user to connect as.
    public var user: String
    /// The password, if one was found; never printed.
    var password: String?
    /// The host name or address; `nil` with a Unix socket.
    public var host: String?
    /// The port (also in a Unix socket's name, `.s.PGSQL.<port>`).
    public var port: Int
    /// The folder of the server's Unix socket, for a local server.
    public var socketDirectory: String?
    /// The database's name.
    public var database: String
    /// How the connection is protected.
    public var tlsMode: TLSMode
    /// A file of trusted root certificates (PEM), for `verify-ca` and `verify-full`.
    public var rootCertificate: String?
    /// The most connections the store's pool opens at once (`connection_limit=`, Hop's own
    /// parameter), at least 1; ``defaultConnectionLimit`` when the URL does not say. The pool
    /// opens them as its queries need them and closes one idle for a minute; a store holds two
    /// more of its own (an engine's liveness lock, and the one that listens for changes).
    public var connectionLimit: Int
    /// The pool's limit when the URL sets none: PostgresNIO's default.
    public static let defaultConnectionLimit = 20

    /// Whether `text` names a PostgreSQL database (`postgres://` or `postgresql://`) rather than a file.
    public static func isPostgresURL(_ text: String) -> Bool {
        text.hasPrefix("postgres://") || text.hasPrefix("postgresql://")
    }

    /// Reads `text`. Credentials missing from it come from `environment` (`PGPASSWORD`,
    /// `PGPASSFILE`, `PGUSER`) and the password file.
    /// - Throws: ``HopError`` `.invalidInput`, naming what is wrong, with the password redacted.
    public init(_ text: String, environment: [String: String] = ProcessInfo.processInfo.environment) throws {
        let shown = Self.redact(text)
        func refuse(
            _ reason: String,
            hint: String = "Write it as postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=require]"
        ) -> HopError {
            HopError(.invalidInput, operation: "read the database URL", path: shown, reason: reason, hint: hint)
        }
        guard Self.isPostgresURL(text), let components = URLComponents(string: text) else {
            throw refuse("it is not a postgres:// URL")
        }
        var query: [String: String] = [:]
        for item in components.queryItems ?? [] {
            guard let value = item.value else { throw refuse("the parameter '\(item.name)' has no value") }
            query[item.name] = value
        }
        let known: Set = [
            "sslmode", "host", "port", "user", "password", "passfile", "sslrootcert", "dbname", "connection_limit",
        ]
        if let unknown = query.keys.sorted().first(where: { !known.contains($0) }) {
            throw refuse(
                "the parameter '\(unknown)' is not supported (supported: \(known.sorted().joined(separator: ", ")))")
        }
        let user = components.user.flatMap { $0.isEmpty ? nil : $0 } ?? query["user"] ?? environment["PGUSER"]
        guard let user, !user.isEmpty else { throw refuse("it names no user (postgres://USER@…)") }
        self.user = user
        port = components.port ?? query["port"].flatMap(Int.init) ?? 5432
        guard (1...65535).contains(port) else { throw refuse("the port \(port) is not a port (1 to 65535)") }
        let hostParameter = query["host"]
        let urlHost = components.host.flatMap { $0.isEmpty ? nil : $0 }
        if let folder = hostParameter ?? urlHost.flatMap({ $0.hasPrefix("/") ? $0 : nil }), folder.hasPrefix("/") {
            socketDirectory = folder
            host = nil
        } else if let name = urlHost ?? hostParameter {
            host = name
            socketDirectory = nil
        } else {
            throw refuse("it names no host (postgres://USER@HOST/…, or ?host=/socket/folder for a local server)")
        }
        var path = components.path
        if path.hasPrefix("/") { path.removeFirst() }
        let database = path.isEmpty ? (query["dbname"] ?? "") : path
        guard !database.isEmpty, !database.contains("/") else {
            throw refuse("it names no database (postgres://USER@HOST/DATABASE)")
        }
        self.database = database
        if let mode = query["sslmode"] {
            guard let parsed = TLSMode(rawValue: mode) else {
                throw refuse("sslmode '\(mode)' is not one of disable, prefer, require, verify-ca, verify-full")
            }
            tlsMode = parsed
        } else {
            tlsMode = socketDirectory == nil ? .prefer : .disable
        }
        if socketDirectory != nil, tlsMode != .disable, tlsMode != .prefer {
            throw refuse("sslmode=\(tlsMode.rawValue) asks for TLS over a Unix socket, which PostgreSQL does not offer")
        }
        rootCertificate = query["sslrootcert"]
        if let limit = query["connection_limit"] {
            guard let parsed = Int(limit), parsed >= 1 else {
                throw refuse(
                    "connection_limit '\(limit)' is not a whole number of at least 1",
                    hint: "Give the most connections the pool may open, e.g. connection_limit=4, or leave it out (20)")
            }
            connectionLimit = parsed
        } else {
            connectionLimit = Self.defaultConnectionLimit
        }
        password =
            components.password ?? query["password"] ?? environment["PGPASSWORD"]
            ?? Self.passwordFromFile(
                query["passfile"] ?? environment["PGPASSFILE"] ?? environment["HOME"].map { $0 + "/.pgpass" },
                host: host ?? "localhost", port: port, database: database, user: user)
    }

    /// The URL as shown: every part but the password, which reads `***`.
    public var redacted: String {
        var text = "postgres://\(user)\(password == nil ? "" : ":***")@\(host ?? "")"
        if host != nil { text += ":\(port)" }
        text += "/\(database)"
        var parameters: [String] = []
        if let socketDirectory { parameters.append("host=\(socketDirectory)") }
        if socketDirectory != nil, port != 5432 { parameters.append("port=\(port)") }
        if tlsMode != (socketDirectory == nil ? .prefer : .disable) { parameters.append("sslmode=\(tlsMode.rawValue)") }
        if connectionLimit != Self.defaultConnectionLimit { parameters.append("connection_limit=\(connectionLimit)") }
        return parameters.isEmpty ? text : text + "?" + parameters.joined(separator: "&")
    }

    public var description: String { redacted }

    /// What `dump` and a debugger show: the redacted URL, never the password.
    public var customMirror: Mirror { Mirror(self, children: ["url": redacted], displayStyle: .struct) }

    /// `text` with the password between `://user:` and `@`, and a `password=` parameter, replaced by `***`.
    public static func redact(_ text: String) -> String {
        var shown = text
        if let scheme = shown.range(of: "://") {
            let rest = shown[scheme.upperBound...]
            if let at = rest.lastIndex(of: "@"), let colon = rest[..<at].firstIndex(of: ":") {
                shown.replaceSubrange(shown.index(after: colon)..<at, with: "***")
            }
        }
        if let parameter = shown.range(of: "password=") {
            let end = shown[parameter.upperBound...].firstIndex(of: "&") ?? shown.endIndex
            shown.replaceSubrange(parameter.upperBound..<end, with: "***")
        }
        return shown
    }

    /// The password of the first matching line of a libpq password file
    /// (`host:port:database:user:password`, `*` matching anything), if the file can be read.
    static func passwordFromFile(_ path: String?, host: String, port: Int, database: String, user: String) -> String? {
        guard let path, let text = try? String(contentsOfFile: path, encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            var fields: [String] = []
            var field = ""
            var escaped = false
            for character in line {
                if escaped {
                    field.append(character)
                    escaped = false
                } else if character == "\\" {
                    escaped = true
                } else if character == ":" && fields.count < 4 {
                    fields.append(field)
                    field = ""
                } else {
                    field.append(character)
                }
            }
            fields.append(field)
            guard fields.count == 5 else { continue }
            let wanted = [host, "\(port)", database, user]
            if zip(fields.prefix(4), wanted).allSatisfy({ $0 == "*" || $0 == $1 }) { return fields[4] }
        }
        return nil
    }

    /// The client configuration this URL describes.
    func clientConfiguration() throws -> PostgresClient.Configuration {
        var configuration: PostgresClient.Configuration
        if let socketDirectory {
            configuration = PostgresClient.Configuration(
                unixSocketPath: "\(socketDirectory)/.s.PGSQL.\(port)", username: user, password: password,
                database: database)
        } else {
            configuration = PostgresClient.Configuration(
                host: host ?? "localhost", port: port, username: user, password: password, database: database,
                tls: try tls())
        }
        configuration.options.additionalStartupParameters = [("application_name", "hop")]
        configuration.options.maximumConnections = connectionLimit
        return configuration
    }

    /// The connection configuration of a connection of its own (liveness locks, notifications).
    package func connectionConfiguration() throws -> PostgresConnection.Configuration {
        var configuration: PostgresConnection.Configuration
        if let socketDirectory {
            configuration = PostgresConnection.Configuration(
                unixSocketPath: "\(socketDirectory)/.s.PGSQL.\(port)", username: user, password: password,
                database: database)
        } else {
            let tls: PostgresConnection.Configuration.TLS
            switch tlsMode {
            case .disable: tls = .disable
            case .prefer: tls = .prefer(try NIOSSLContext(configuration: tlsConfiguration()))
            default: tls = .require(try NIOSSLContext(configuration: tlsConfiguration()))
            }
            configuration = PostgresConnection.Configuration(
                host: host ?? "localhost", port: port, username: user, password: password, database: database,
                tls: tls)
        }
        configuration.options.additionalStartupParameters = [("application_name", "hop")]
        return configuration
    }

    private func tls() throws -> PostgresClient.Configuration.TLS {
        switch tlsMode {
        case .disable: .disable
        case .prefer: .prefer(try tlsConfiguration())
        case .require, .verifyCA, .verifyFull: .require(try tlsConfiguration())
        }
    }

    /// What libpq's `sslmode` means for the certificate: `prefer` and `require` encrypt without
    /// checking it, `verify-ca` checks it against the roots, `verify-full` the host name too.
    private func tlsConfiguration() throws -> TLSConfiguration {
        var configuration = TLSConfiguration.makeClientConfiguration()
        switch tlsMode {
        case .disable, .prefer, .require: configuration.certificateVerification = .none
        case .verifyCA: configuration.certificateVerification = .noHostnameVerification
        case .verifyFull: configuration.certificateVerification = .fullVerification
        }
        if let rootCertificate { configuration.trustRoots = .file(rootCertificate) }
        return configuration
    }
}
