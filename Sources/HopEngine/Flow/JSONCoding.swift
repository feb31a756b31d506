import Foundation

/// JSON as Hop stores it: step outputs and decision values.
enum JSONCoding {
    static func encode(_ value: some Encodable) throws -> String {
        do {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            encoder.dateEncodingStrategy = .millisecondsSince1970
            return String(decoding: try encoder.encode(value), as: UTF8.self)
        } catch {
            throw HopError(.encoding, "cannot encode \(type(of: value)) as JSON: \(error)")
        }
    }

    static func decode<T: Decodable>(_ type: T.Type, from json: String, what: String) throws -> T {
        do {
            let decoder = JSONDecoder()
            decoder.dateDecodingStrategy = .millisecondsSince1970
            return try decoder.decode(type, from: Data(json.utf8))
        } catch {
            throw HopError(.encoding, "cannot decode \(what) as \(type): \(error)")
        }
    }
}
